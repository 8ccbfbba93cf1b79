export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0
export GRACEFUL_GRACE_PERIOD=60 GRACEFUL_PROPAGATION_WAIT=3s GRACEFUL_EXEMPT_PATHS=/health,/metrics
python tests/vllm/make_model.py /tmp/tiny-model   # in a clone of this repository: a random 2-layer model, no hub
vllm serve /tmp/tiny-model --dtype float32 --enforce-eager --max-model-len 16384 \
    --middleware graceful.GracefulMiddleware
