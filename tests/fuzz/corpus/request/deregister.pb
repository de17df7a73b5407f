

verifier-1SIGTERM0123456789abcdef