#!/usr/bin/env bash
# The README's figures for a many-core GPU host, in one run: worker scaling 1-8 with the
# main process's share of a core, and a batch's hand-over to the GPU with pin_memory
# (benchmarks/throughput.py does both where CUDA is available), and the final-batch write
# alone (benchmarks/batchwrite.py). Run from the repository
# root of a checkout (no install needed); results go to $OUT (default benchmarks/results).
#
#     OUT=/tmp/gpu bash benchmarks/gpu_host.sh
set -euo pipefail
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
# A plain checkout: fmsdata.handlers is the top-level handlers/ folder (pyproject maps it).
[ -e fmsdata/handlers ] || ln -s ../handlers fmsdata/handlers
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "
import os, numba, numpy, pyarrow, torch
print('cpus', os.cpu_count(), 'torch', torch.__version__, 'numpy', numpy.__version__,
      'numba', numba.__version__, 'pyarrow', pyarrow.__version__,
      'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)
"
start=$SECONDS
python3 benchmarks/batchwrite.py --out "$OUT/batchwrite-gpu-host.json" \
    --chart "$OUT/batchwrite-gpu-host.png" 2>&1 | tee "$OUT/batchwrite-gpu-host.log"
python3 benchmarks/throughput.py ${QUICK:+--quick} --prepare --corpora "${CORPORA:-long,short,doc60}"
echo "corpora written in $((SECONDS - start)) s"
python3 benchmarks/throughput.py ${QUICK:+--quick} --workers "${WORKERS:-1,2,4,8}" --repeat 1 \
    --corpora "${CORPORA:-long,short,doc60}" \
    --out "$OUT/throughput-gpu-host.json" --chart "$OUT/throughput-gpu-host.png" \
    2>&1 | tee "$OUT/throughput-gpu-host.log"
echo "done in $((SECONDS - start)) s"
