%!Z
verifier-1b	drafter-1jon