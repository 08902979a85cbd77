"""C++ source text read by hand, one rule for the whole of Astra: `text` blanks comments and literals
(offsets kept), `brackets` matches brackets and splits lists at their top level (with the one reading
of `<`/`>` as brackets or comparisons), `entry` reads a wrapper's entry string (`ns::Kernel<4>::run`),
`decls` cuts a file into its namespace-scope declarations."""
