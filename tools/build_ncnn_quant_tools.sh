#!/usr/bin/env bash
# Build ncnn's own post-training int8 tools (ncnn2table, ncnn2int8) from ncnn's source, to
# validate `paramsurgery quantize` against them (tests/test_quantize.py -m slow,
# tools/compare_ncnn_quantize.py).
#
#   tools/build_ncnn_quant_tools.sh [NCNN_GIT_DIR] [BUILD_DIR]
#
# NCNN_GIT_DIR: a clone (or bare mirror) of github.com/Tencent/ncnn; BUILD_DIR defaults to
# /tmp/paramsurgery-ncnn-tools. Only the two targets are built (-j2): CPU only, no Vulkan, no
# per-ISA runtime dispatch, simpleocv (no OpenCV), npy calibration inputs. The binaries end up
# in BUILD_DIR/build/tools/quantize/. Layer types the corpus CNNs do not use (recurrent,
# attention, 1-D/3-D convolutions, detection heads, ...) are left out: the build takes a
# third of the time (2 shared cores: ~40 min).
set -euo pipefail
unused="ArgMax Deconvolution Embed MVN Proposal ROIPooling SPP Threshold Tile RNN LSTM Normalize
PriorBox DetectionOutput DeconvolutionDepthWise InstanceNorm Reorg YoloDetectionOutput
Yolov3DetectionOutput PSROIPooling ROIAlign PixelShuffle DeepCopy StatisticsPooling GroupNorm
Softplus GRU MultiHeadAttention Convolution1D Pooling1D ConvolutionDepthWise1D Convolution3D
ConvolutionDepthWise3D Pooling3D MatMul Deconvolution1D DeconvolutionDepthWise1D Deconvolution3D
DeconvolutionDepthWise3D Einsum DeformableConv2D GLU Fold Unfold GridSample CumulativeSum CopyTo
Diag CELU Shrink RMSNorm Spectrogram InverseSpectrogram Flip SDPA RotaryEmbed"
layer_flags=()
for layer in $unused; do layer_flags+=("-DWITH_LAYER_${layer,,}=OFF"); done
src_git=${1:-/work/.mirror/Tencent+ncnn/repo}
build_dir=${2:-/tmp/paramsurgery-ncnn-tools}
mkdir -p "$build_dir/src"
if [ ! -f "$build_dir/src/CMakeLists.txt" ]; then
    # the mirror may lack its largest blobs (example weights): not needed to build the tools
    git -C "$src_git" archive --format=tar HEAD -- . ':!examples/*.bin' ':!examples/*.caffemodel' \
        | tar -x -C "$build_dir/src"
    git -C "$src_git" rev-parse HEAD > "$build_dir/src/COMMIT"
fi
cmake -S "$build_dir/src" -B "$build_dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DNCNN_VULKAN=OFF -DNCNN_BUILD_TOOLS=ON -DNCNN_BUILD_EXAMPLES=OFF \
    -DNCNN_BUILD_BENCHMARK=OFF -DNCNN_BUILD_TESTS=OFF -DNCNN_PYTHON=OFF \
    -DNCNN_RUNTIME_CPU=OFF -DNCNN_AVX2=OFF -DNCNN_AVX512=OFF -DNCNN_AVX=OFF -DNCNN_FMA=OFF \
    -DNCNN_F16C=OFF -DNCNN_XOP=OFF -DNCNN_AVXVNNI=OFF -DNCNN_OPENMP=ON \
    -DNCNN_SIMPLEOCV=ON -DNCNN_INT8=ON -DNCNN_BUILD_SHARED_LIBS=OFF "${layer_flags[@]}" \
    > "$build_dir/cmake.log"
cmake --build "$build_dir/build" --target ncnn2table ncnn2int8 -j2
ls -l "$build_dir/build/tools/quantize/ncnn2table" "$build_dir/build/tools/quantize/ncnn2int8"
