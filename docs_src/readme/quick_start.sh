bash scripts/demo        # installs HAProxy, nginx and the project, then rolls 3 replicas under load: baseline vs graceful
bash scripts/test        # installs what the tests need (test extras; HAProxy, nginx with its Lua module, wrk when root), then runs the suite with coverage
