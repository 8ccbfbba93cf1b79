task "api" {
  kill_timeout   = "60s"
  shutdown_delay = "5s"
  env { GRACEFUL_GRACE_PERIOD = "60" }
}
