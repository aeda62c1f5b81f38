from lib.model import build


def main():
    model = build(depth=-1)
    print(model)


if __name__ == "__main__":
    main()
