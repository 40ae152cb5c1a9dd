#!/usr/bin/env bash
# Build llama.cpp with CUDA on a machine WITHOUT a GPU (nvcc 13.0 here, cuBLAS headers from PyPI), from the very
# tree llama-cpp-python 0.3.36 vendors, and pack it for a lent GPU machine (tools/cuda_check.py):
#
#   .gpu/py/llama_cpp/      llama-cpp-python's own Python code, its lib/ holding this CUDA build (libllama, libggml*,
#                           libggml-cuda for sm_90) and llama-bench, linked with RUNPATH $ORIGIN
#   .whl/                   the Python packages edgekv needs that the GPU machine's image lacks (Python 3.12 wheels)
#
# Run from the repository root with the venv installed (.venv) and
# `python -m tools.cuda_check --models-dir $EDGEKV_CUDA_PACK/models prepare` done.
# Takes about 35 minutes on 2 cores (144 CUDA files).  Nothing here is committed but this script; .gpu and .whl are
# listed in .git/info/exclude.
#
# Why a stub libcuda.so: ggml-cuda links the driver (CUDA::cuda_driver, for its VMM pool) and a machine without a
# GPU has no driver library.  The stub defines the driver functions ggml-cuda calls (each returns 100,
# CUDA_ERROR_NO_DEVICE) under the soname libcuda.so.1, which the real driver satisfies there: a stub without them is
# dropped by the linker (--as-needed) and the library then fails to load with "undefined symbol: cuMemCreate".
set -euo pipefail
ROOT=$(pwd)
W=${EDGEKV_CUDA_WORK:-/tmp/edgekv-cuda}
G=${EDGEKV_CUDA_PACK:-.gpu}        # the pack folder (relative to the root): py/, models/ (the headers), pack.tar.xz
LCP=0.3.36
mkdir -p "$W"
cd "$W"
[ -f "llama_cpp_python-$LCP.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LCP" -d .
[ -d "llama_cpp_python-$LCP" ] || tar xzf "llama_cpp_python-$LCP.tar.gz"
if [ ! -d cublas ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
    "nvidia-cublas>=13.0,<13.1" -d cublas-whl
  python3 -m zipfile -e cublas-whl/nvidia_cublas-*.whl cublas
fi
# a CUDA root: the installed toolkit (symlinks), cuBLAS's headers and libraries, a stub driver library
if [ ! -d cudaroot ]; then
  cp -as "$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")" cudaroot
  for h in cublas/nvidia/cu13/include/*.h; do ln -sf "$W/$h" cudaroot/include/; done
  for l in libcublas libcublasLt; do
    ln -sf "$W/cublas/nvidia/cu13/lib/$l.so.13" "cudaroot/lib/$l.so.13"; ln -sf "$l.so.13" "cudaroot/lib/$l.so"
  done
  mkdir -p cudaroot/lib/stubs
  echo 'void edgekv_cuda_stub(void) {}' > cudaroot/lib/stubs/stub.c
  gcc -shared -fPIC -o cudaroot/lib/stubs/libcuda.so -Wl,-soname,libcuda.so.1 cudaroot/lib/stubs/stub.c
fi
SRC="$W/llama_cpp_python-$LCP/vendor/llama.cpp"
# llama.cpp's defaults for a CUDA build, for the H100/H200's sm_90, with the CPU code for any x86-64 with AVX2
# (not -march=native: this machine is not the GPU machine)
cmake -S "$SRC" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$W/cudaroot/bin/nvcc" -DCUDAToolkit_ROOT="$W/cudaroot" \
  -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined >cmake.log
ninja -C build -j"$(nproc)" llama-bench llama
if ! readelf -d build/bin/libggml-cuda.so | grep -q 'libcuda.so.1'; then
  # the first link shows which driver functions ggml-cuda calls: the stub defines them, and ggml-cuda is linked again
  nm -D --undefined-only build/bin/libggml-cuda.so | awk '$2 ~ /^cu[A-Z]/ {sub(/@.*/, "", $2); print $2}' | sort -u |
    while read -r f; do echo "int $f(void) { return 100; }"; done > cudaroot/lib/stubs/stub.c
  gcc -shared -fPIC -o cudaroot/lib/stubs/libcuda.so -Wl,-soname,libcuda.so.1 cudaroot/lib/stubs/stub.c
  rm -f build/bin/libggml-cuda.so*
  ninja -C build -j"$(nproc)" llama-bench llama
fi

# pack: llama-cpp-python's Python code with this build as its lib/ (its loader looks there; _ggml.py too)
cd "$ROOT"
SITE=$(.venv/bin/python -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')
rm -rf $G/py && mkdir -p $G/py/llama_cpp/lib
(cd "$SITE" && find . -name '*.py' -not -path './server/*' -exec cp --parents {} "$ROOT/$G/py/llama_cpp/" \;)
for f in "$W"/build/bin/lib*.so.0 "$W"/build/bin/libllama-bench-impl.so "$W"/build/bin/llama-bench; do
  cp -L "$f" $G/py/llama_cpp/lib/
done
strip --strip-unneeded $G/py/llama_cpp/lib/*.so* $G/py/llama_cpp/lib/llama-bench
# one archive (the GPU machine takes 64 MiB with the repository; libggml-cuda alone is 60 MB, 38 MB as xz); the
# unversioned names are made there: `for f in *.so.0; do ln -sf $f ${f%.0}; done` in its lib/
tar -C "$G" -cf - py models | xz -T0 -6 > $G/pack.tar.xz

# the wheels for Python 3.12 that the GPU image lacks (its KINDS.md list): versions as in this venv
mkdir -p .whl
pkgs=$(.venv/bin/python - <<'EOF'
from importlib.metadata import version
names = ["gguf", "msgspec", "httpx2", "httpcore2", "truststore", "huggingface_hub", "typer", "pydantic",
         "pydantic_core", "annotated-types", "typing-inspection", "annotated-doc", "h11", "diskcache"]
print(" ".join(f"{n}=={version(n)}" for n in names))
EOF
)
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pkgs
du -sh $G/pack.tar.xz .whl
# On the GPU machine (one `run` of the device tool, carry .gpu/pack.tar.xz and .whl), the command used on 27 Nov:
#   tar -C .gpu -xJf .gpu/pack.tar.xz; B=$PWD/.gpu/py/llama_cpp/lib; (cd $B && for f in *.so.0; do ln -sf $f ${f%.0}; done)
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   LD_LIBRARY_PATH=<the folders of libcublas.so.13 and libcudart.so.13 there> PYTHONPATH=/tmp/site:$PWD/.gpu/py:$PWD \
#     python3 -m tools.cuda_check --models-dir .gpu/models speed --out $OUT/speed --budget 420 --llama-bench $B/llama-bench
