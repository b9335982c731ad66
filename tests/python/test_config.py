"""Config: defaults, good and bad values for every setting, and the messages naming fields."""
import copy

import pytest

import shmipc

Invalid = shmipc.InvalidArgumentError


def refused(field, fn, *args, exc=Invalid):
    with pytest.raises(exc) as info:
        fn(*args)
    assert field in str(info.value), str(info.value)
    return info.value


def test_defaults_match_reference():
    c = shmipc.Config()
    assert c.memmap == "memfd"
    assert c.buffer_capacity == 32 << 20
    assert c.queue_capacity == 8192
    assert c.slice_classes == [(8172, 50), (32748, 30), (131052, 20)]
    assert c.path_prefix == "/dev/shm/shmipc"
    assert c.initialize_timeout == 1.0
    assert c.connection_write_timeout == 10.0
    assert c.read_timeout is None and c.write_timeout is None
    assert (c.protocol, c.fallback, c.wakeup, c.polling_interval_us) == ("legacy", False, "socket", 0)
    c.validate()


def test_keyword_construction():
    c = shmipc.Config(buffer_capacity=1 << 20, slice_classes="16364:40,4076:60", queue_capacity=1024)
    assert c.slice_classes == [(4076, 60), (16364, 40)]
    with pytest.raises(TypeError, match="unexpected keyword"):
        shmipc.Config(buffer_capacty=1 << 20)
    with pytest.raises(TypeError, match="unexpected keyword"):
        shmipc.Config(protocol="v4")  # read-only property: use set_protocol()
    with pytest.raises(TypeError):
        shmipc.Config(1 << 20)


def test_buffer_capacity():
    c = shmipc.Config()
    c.buffer_capacity = 1 << 30
    assert c.buffer_capacity == 1 << 30
    for bad in (0, (1 << 20) - 1, 1 << 32, -1, 1 << 80):
        refused("buffer_capacity", setattr, c, "buffer_capacity", bad)
    assert c.buffer_capacity == 1 << 30
    with pytest.raises(TypeError):
        c.buffer_capacity = "big"
    with pytest.raises(TypeError):
        c.buffer_capacity = True
    with pytest.raises(AttributeError):
        del c.buffer_capacity


def test_buffer_capacity_must_hold_each_class():
    c = shmipc.Config(buffer_capacity=4 << 20, slice_classes=[(4096, 50), (600000, 50)])
    refused("buffer_capacity", setattr, c, "buffer_capacity", 1 << 20)
    assert c.buffer_capacity == 4 << 20


@pytest.mark.parametrize("good", [1, 16, 64, 1024, 8192, 65535, 65536, 1 << 24])
def test_queue_capacity_good(good):
    c = shmipc.Config()
    c.queue_capacity = good
    assert c.queue_capacity == good


@pytest.mark.parametrize("bad, why", [(0, "outside"), ((1 << 24) + 16, "outside"), (8, "split lock"),
                                      (24, "split lock"), (2, "split lock"), (1 << 33, "range")])
def test_queue_capacity_bad(bad, why):
    c = shmipc.Config()
    e = refused("queue_capacity", setattr, c, "queue_capacity", bad)
    assert why in str(e)
    assert c.queue_capacity == 8192


def test_slice_classes_forms():
    c = shmipc.Config(buffer_capacity=1 << 20)
    c.slice_classes = [(16364, 40), [4076, 60]]
    assert c.slice_classes == [(4076, 60), (16364, 40)]
    c.slice_classes = " 131052:20, 8172 : 50,32748:30"
    assert c.slice_classes == [(8172, 50), (32748, 30), (131052, 20)]
    c.slice_classes = "524268:100"  # one slice: allowed, as in the captured fallback vector
    assert c.slice_classes == [(524268, 100)]


@pytest.mark.parametrize(
    "bad, why",
    [
        ([(4096, 40), (8192, 50)], "sum to 90"),
        ([(4096, 60), (8192, 50)], "sum to 110"),
        ([(0, 100)], "size 0"),
        ([(4097, 100)], "multiple of 4"),
        ([(4096, 0), (8192, 100)], "percent 0"),
        ([(4096, 50), (4096, 50)], "twice"),
        ([((32 << 20) + 4, 100)], "larger than buffer_capacity"),
        ([], "slice_classes"),
        ([(64 + i, 1) for i in range(33)], "slice_classes"),
        ("", "slice_classes"),
        ("4096", "slice_classes"),
        ("4096:100,", "slice_classes"),
        ("4096;100", "slice_classes"),
        ("99999999999:100", "slice_classes"),
        ("-1:100", "slice_classes"),
    ],
)
def test_slice_classes_refused(bad, why):
    c = shmipc.Config()
    e = refused("slice_classes", setattr, c, "slice_classes", bad)
    assert why in str(e)
    assert c.slice_classes == [(8172, 50), (32748, 30), (131052, 20)]


def test_slice_classes_type_errors():
    c = shmipc.Config()
    with pytest.raises(TypeError):
        c.slice_classes = 5
    with pytest.raises(TypeError):
        c.slice_classes = [4096]
    with pytest.raises(TypeError):
        c.slice_classes = [(4096, 50, 1)]
    refused("slice_classes", setattr, c, "slice_classes", [(-1, 100)])
    refused("slice_classes", setattr, c, "slice_classes", [(1 << 40, 100)])


def test_memmap():
    c = shmipc.Config(memmap="devshm")
    assert c.memmap == "devshm"
    refused("memmap", setattr, c, "memmap", "files")
    refused("memmap", setattr, c, "memmap", 0)
    assert c.memmap == "devshm"


def test_path_prefix():
    c = shmipc.Config(path_prefix="/dev/shm/myapp")
    assert c.path_prefix == "/dev/shm/myapp"
    refused("path_prefix", setattr, c, "path_prefix", "")
    refused("path_prefix", setattr, c, "path_prefix", "a\nb")
    refused("path_prefix", setattr, c, "path_prefix", "/" + "a" * 180, exc=shmipc.Error)
    c.path_prefix = "/" + "a" * 179
    c.path_prefix = "label"  # memfd names are only labels
    refused("path_prefix", setattr, c, "memmap", "devshm")
    c.path_prefix = "/dev/shm/x"
    c.memmap = "devshm"
    refused("absolute", setattr, c, "path_prefix", "label")
    with pytest.raises(ValueError):
        c.path_prefix = "a\0b"
    assert c.path_prefix == "/dev/shm/x"


def test_long_prefix_is_name_too_long():
    e = refused("path_prefix", setattr, shmipc.Config(), "path_prefix", "/" + "a" * 200, exc=shmipc.Error)
    assert e.name == "SHMIPC_ENAMETOOLONG"


def test_timeouts():
    c = shmipc.Config(read_timeout=1.5, write_timeout=0.0001, initialize_timeout=0.05)
    assert c.read_timeout == 1.5
    assert c.write_timeout == 0.001  # below a millisecond rounds up, never to "forever"
    assert c.initialize_timeout == 0.05
    c.read_timeout = None
    assert c.read_timeout is None
    # 0 does not wait and negative waits forever (test_vocabulary.py has the rule).
    refused("read_timeout", setattr, c, "read_timeout", float("nan"))
    refused("read_timeout", setattr, c, "read_timeout", float("inf"))
    refused("initialize_timeout", setattr, c, "initialize_timeout", 0)
    refused("connection_write_timeout", setattr, c, "connection_write_timeout", 3601)
    with pytest.raises(TypeError):
        c.read_timeout = "soon"
    assert c.initialize_timeout == 0.05


def test_protocol_and_wakeup():
    c = shmipc.Config()
    refused("need protocol V4", c.set_wakeup, "eventfd")
    refused("protocol", c.set_protocol, "v3")
    refused("fallback", c.set_protocol, "legacy", True)
    assert c.set_protocol("v4") is c
    assert (c.protocol, c.fallback) == ("v4", False)
    assert c.set_wakeup("polling", 100) is c
    assert (c.wakeup, c.polling_interval_us) == ("polling", 100)
    refused("polling_interval_us", c.set_wakeup, "polling", 0)
    refused("polling_interval_us", c.set_wakeup, "polling", 1000001)
    refused("polling_interval_us", c.set_wakeup, "eventfd", 5)
    refused("wakeup", c.set_wakeup, "carrier-pigeon")
    # Out of the field's range: refused, not wrapped (2**32 + 100 was read as 100).
    for bad in (2**32 + 100, -1):
        with pytest.raises(OverflowError):
            c.set_wakeup("polling", bad)
    with pytest.raises(TypeError):
        c.set_wakeup("polling", 1.5)
    assert c.wakeup == "polling"
    c.set_protocol("legacy")
    assert (c.wakeup, c.polling_interval_us) == ("socket", 0)


def test_eventfd_needs_memfd():
    c = shmipc.Config(memmap="devshm").set_protocol("v4", fallback=True)
    refused("memfd", c.set_wakeup, "eventfd")
    c.with_v4_eventfd()
    assert c.memmap == "memfd"
    refused("eventfd", setattr, c, "memmap", "devshm")


def test_v4_helpers_chain():
    c = shmipc.Config().with_v4()
    assert (c.protocol, c.fallback, c.wakeup) == ("v4", True, "socket")
    assert c.with_v4_eventfd().wakeup == "eventfd"
    c.with_v4_event_queue_polling(250)
    assert (c.wakeup, c.polling_interval_us) == ("polling", 250)
    refused("polling_interval_us", c.with_v4_event_queue_polling, 0)
    refused("polling_interval_us", c.with_v4_event_queue_polling, 1 << 40)
    with pytest.raises(TypeError):
        c.with_v4_event_queue_polling("fast")
    assert c.polling_interval_us == 250
    c.validate()


def test_copy_is_independent():
    c = shmipc.Config(queue_capacity=1024)
    d = c.copy()
    e = copy.copy(c)
    c.queue_capacity = 64
    assert d.queue_capacity == 1024 and e.queue_capacity == 1024
    assert type(d) is shmipc.Config


def test_subclass_keeps_working():
    class Mine(shmipc.Config):
        pass

    m = Mine(queue_capacity=64)
    refused("queue_capacity", setattr, m, "queue_capacity", 0)
    assert isinstance(m.copy(), Mine)


def test_repr_and_help():
    r = repr(shmipc.Config().with_v4())
    assert "protocol=v4+fallback" in r and "buffer_capacity=33554432" in r
    assert "slice_classes" in shmipc.Config.__doc__ or "keyword" in shmipc.Config.__doc__
    assert "fallback" in shmipc.Config.set_protocol.__doc__


def test_session_manager_fields():
    c = shmipc.Config(session_num=4, max_stream_num=128, rebuild_interval=0.25)
    assert (c.session_num, c.max_stream_num, c.rebuild_interval) == (4, 128, 0.25)
    refused("session_num", setattr, c, "session_num", 0)
    refused("session_num", setattr, c, "session_num", 1025)
    refused("max_stream_num", setattr, c, "max_stream_num", 0)
    refused("rebuild_interval", setattr, c, "rebuild_interval", 0)
    refused("rebuild_interval", setattr, c, "rebuild_interval", float("nan"))
    assert (c.session_num, c.max_stream_num, c.rebuild_interval) == (4, 128, 0.25)
