"""`python -m nccl_tune` runs the CLI."""

from nccl_tune.cli import main

if __name__ == "__main__":
    main()
