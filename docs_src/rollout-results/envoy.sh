for seed in 5 6; do
    for retry in none istio not-started; do
        python -m examples.rollout --balancer envoy --scenario strict-clients --envoy-retry $retry --seed $seed
    done
    python -m examples.rollout --balancer envoy --scenario strict-clients --no-admit-during-propagation \
        --envoy-retry not-started --seed $seed
done
