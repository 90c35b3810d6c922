#!/usr/bin/env bash
# Device run: Nsight Compute over the MXFP4 expert GEMMs at 2048 tokens (256 experts).
O=$1
OUT=$O timeout 150 bash tools/gpu/profile-kernel mxfp4-specialized specialized_experts_kernel --launches 2 --micro cuda_moe_experts --tokens 2048 --local-experts 256 --reps 1
OUT=$O timeout 100 bash tools/gpu/profile-kernel mxfp4-wgmma grouped_experts_kernel --launches 1 --micro cuda_moe_experts --tokens 2048 --local-experts 256 --reps 1
