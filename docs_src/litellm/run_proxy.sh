CONFIG_FILE_PATH=/etc/litellm/config.yaml graceful run litellm.proxy.proxy_server:app --host 0.0.0.0 --port 4000
