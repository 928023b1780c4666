"""A program that uses more memory than its machine type allows.

It allocates 50 MB at a time and writes into every page, so the memory is really
used (an untouched bytearray could stay virtual). On n1-standard-1 a replica may
use about 2.25 GB; past that the kernel's OOM killer ends the process and
Trainyard reports the job FAILED with "ran out of memory" (not a plain exit 137).
"""
import time

CHUNK = 50 * 1024 * 1024  # 50 MiB
PAGE = 4096

chunks = []
while True:
    block = bytearray(CHUNK)
    # Touch one byte per page so that every page gets backed by real memory.
    for i in range(0, CHUNK, PAGE):
        block[i] = 1
    chunks.append(block)
    held = len(chunks) * CHUNK / 1024**3
    print(f"holding {held:.2f} GiB", flush=True)
    time.sleep(0.05)
