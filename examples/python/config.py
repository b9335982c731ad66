"""Build a shmipc config in Python, print it, and show how a refused value reads.

Run from the repository after building: PYTHONPATH=build/python python3 examples/python/config.py
"""
import shmipc

cfg = shmipc.Config(buffer_capacity=64 << 20, slice_classes="4076:60,16364:40",
                    queue_capacity=1024, read_timeout=2.5)
cfg.with_v4_event_queue_polling(200)
print("shmipc", shmipc.__version__)
print(cfg)

try:
    cfg.queue_capacity = 8  # an 8-byte queue counter would straddle a cache line
except shmipc.InvalidArgumentError as e:
    print(f"refused: {e.strerror} ({e.name}, errno {e.errno})")
