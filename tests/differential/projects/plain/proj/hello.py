import sys

from observe import record

print("hello", *sys.argv[1:])
record(globals())
