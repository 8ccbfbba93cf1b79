for balancer in haproxy haproxy-http nginx; do
    python -m examples.rollout --scenario strict-clients --balancer $balancer
done
