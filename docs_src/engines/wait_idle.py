import anyio

from graceful.engine import wait_idle


async def main() -> None:
    result = await wait_idle("vllm", grace_period=300, propagation_wait=5)
    if not result.idle:
        print(result.result, result.values)  # "timeout", "gone", "dead" or "unreachable", and each metric's last value


anyio.run(main)  # on asyncio; anyio.run(main, backend="trio") on trio
