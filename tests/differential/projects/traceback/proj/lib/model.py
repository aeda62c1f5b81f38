def check(depth):
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")


def build(depth):
    print(f"building depth={depth}", flush=True)
    check(depth)
    return depth
