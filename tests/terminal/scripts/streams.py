"""What a script sees of its streams, one line on stdout, one on stderr."""

import os
import sys

print(f"tty out={sys.stdout.isatty()} err={sys.stderr.isatty()} in={sys.stdin.isatty()} "
      f"marker={'PHALANX_STDIO' in os.environ} size={os.get_terminal_size(1).columns if sys.stdout.isatty() else '-'}",
      flush=True)
print("to-err", file=sys.stderr, flush=True)
