"""input() and breakpoint(), as a person at the terminal uses them."""

name = input("name? ")
print(f"hello {name}", flush=True)
x = 41
breakpoint()
print(f"x is {x}", flush=True)
