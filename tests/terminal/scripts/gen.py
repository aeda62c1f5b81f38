"""Prints a line every 0.1 s for ten minutes: what ``| head -1`` cuts short."""
import time

for i in range(6000):
    print(f"line {i}", flush=True)
    time.sleep(0.1)
