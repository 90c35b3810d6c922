O=$1
ROUNDS=2 OUT=$O tools/gpu/compare-options persistent-fp8-experts false true --expert-format fp8 -q fp8 --batch 1 --prefill 2048,8192 > $O/compare.log 2>&1
tail -60 $O/compare.log
