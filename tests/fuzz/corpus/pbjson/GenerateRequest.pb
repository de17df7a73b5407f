
def fibonacci(n): @*млL?33s?( 2

2```:Breq-1