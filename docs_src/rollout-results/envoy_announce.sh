heard="--balancer envoy --scenario strict-clients --active-hc --lb-delay 10s --propagation-quiet 1s"
for seed in 5 6; do
    python -m examples.rollout $heard --seed $seed
    python -m examples.rollout $heard --no-announce-drain --skip-baseline --seed $seed
    python -m examples.rollout $heard --no-announce-drain --skip-baseline --propagation-wait 12s --seed $seed
done
