"""Framework adapters. Each module imports its framework; ``rkv`` itself never does."""
