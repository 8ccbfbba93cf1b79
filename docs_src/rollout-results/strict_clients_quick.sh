quick="--quick --scenario strict-clients --lb-delay 2s --propagation-wait 3s --grace-period 15s"
# graceful's default, admitting during the propagation wait, behind each balancer:
for balancer in haproxy haproxy-http nginx; do
    python -m examples.rollout $quick --balancer $balancer
done
# refusing from the drain's first instant, behind each L7 balancer, without and with its retry:
for balancer in haproxy-http nginx; do
    python -m examples.rollout $quick --balancer $balancer --no-admit-during-propagation
    python -m examples.rollout $quick --balancer $balancer --no-admit-during-propagation --gateway-retry
done
