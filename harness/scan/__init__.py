"""The static scans a candidate passes before the judge builds or loads it: the candidate's kernel source
against the original's (`source_scan`, lexed by `source_text`), and the built shared object against the
original's (`elf_scan`)."""
