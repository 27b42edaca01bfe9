"""What the image does not need: the test model, the slow mock volume, the benchmarks."""
