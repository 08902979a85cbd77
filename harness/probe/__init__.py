"""Probing the ORIGINAL kernel of a drafted spec: what it does with each case and the module rule
(`observation`), and the processes that run it (`processes`)."""
