
Heÿ