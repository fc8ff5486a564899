"""Launch: starting ranks (local processes, torchrun, one process for all ranks) and reporting
how they ended."""
