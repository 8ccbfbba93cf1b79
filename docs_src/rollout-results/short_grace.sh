# Each run is two columns: the graceful side with --admission all, then with --admission fits.
python -m examples.rollout --scenario short-grace --balancer haproxy --report short-grace-haproxy.json
python -m examples.rollout --scenario short-grace --balancer nginx --gateway-retry --report short-grace-nginx.json
