"""A queue consumer that a drain waits for (docs/middleware.md, "Queue consumers and other non-HTTP work")."""

import asyncio


async def run(job):
    await asyncio.sleep(job)  # the work; here a job is a number of seconds


# fmt: off
# --8<-- [start:consumer]
async def consumer(queue, drain):
    while drain.accepting:                 # stop taking work once draining
        job = await queue.get()
        async with drain.track("job"):     # counted in flight; raises NotAccepting when not serving
            await run(job)
# --8<-- [end:consumer]
# fmt: on
