"""erlcuda's worker: GPU compute for the BEAM, reached through an Erlang port.

Layers, each with its own exception type:

- ``etf``      Erlang External Term Format codec              -> ``CodecError``
- ``framing``  4-byte length-prefixed frames on fds 3/4       -> ``FrameError``
- ``kernels``  the kernel catalogue and argument checking     -> ``BadArgs``
- ``backends`` cpu (numpy) and cuda (PyCUDA) devices          -> ``BackendError``
- ``worker``   the port protocol, device threads and batching
"""

__version__ = "0.1.0"
