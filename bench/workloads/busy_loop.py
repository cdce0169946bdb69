"""One core kept busy, for the co-located load (bench/peers/colocated.py): a plain Python loop that never sleeps and
touches little memory, so it takes CPU time from the runtime under test and not memory bandwidth.

    python -m bench.workloads.busy_loop
"""

if __name__ == "__main__":
    while True:
        pass
