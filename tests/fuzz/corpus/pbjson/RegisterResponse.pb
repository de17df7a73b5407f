&

verifier-1èˆ'"
same-tokenizerdiffer