for seed in 5 6; do
    python -m examples.rollout --vllm --quick --seed $seed
    python -m examples.rollout --vllm --quick --seed $seed --scenario strict-clients --skip-baseline
done
python -m examples.rollout --vllm --seed 5
