&

verifieÏ1èˆ'"
same-tokenizerdiffer