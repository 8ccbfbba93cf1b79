"""Soak an endpoint while a rollout runs, and stop when the rollout ends.

python soak_rollout.py http://127.0.0.1:8000 kubectl rollout status deployment/llm
"""

import json
import sys

import anyio

from graceful.soak import RequestRecord, SoakConfig, run_soak


async def main(url: str, *rollout: str) -> int:
    stop = anyio.Event()  # once set, no new request starts; those in flight finish

    async def roll_out() -> None:
        await anyio.run_process(rollout, stdout=None, stderr=None, check=False)
        stop.set()

    def on_record(record: RequestRecord) -> None:  # each request, as it ends
        if record.reason != "ok":
            print(record.request_id, record.served_by, record.reason, record.error)

    async with anyio.create_task_group() as tg:
        tg.start_soon(roll_out)
        report = await run_soak(SoakConfig(url=url, duration=600, retry="sdk"), stop=stop, on_record=on_record)
    print(report.render())  # the table
    with open("report.json", "w") as out:
        json.dump(report.to_json(), out)  # the --report numbers
    return report.exit_code  # 0: no unexplained loss


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:]))
