for seed in 5 6; do
    python -m examples.rollout --gateway litellm --handoff-streams --scenario strict-clients --seed $seed
done
