#!/usr/bin/env python3
"""Writes GLM-5.2's config cut to 5 layers with one dense layer first (the shape the CUDA
benchmarks' targets name) to the path given."""
import json
import sys

cfg = json.load(open("models/configs/glm-5.2.json"))
cfg["num_hidden_layers"] = 5
cfg["first_k_dense_replace"] = 1
json.dump(cfg, open(sys.argv[1], "w"), indent=2)
