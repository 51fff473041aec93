"""erlcuda's worker: GPU compute for the BEAM, reached through an Erlang port.

Layers, each with its own exception type:

- ``contract`` the wire contract, read from ``contract.json``
- ``etf``      Erlang External Term Format codec              -> ``CodecError``
- ``framing``  4-byte length-prefixed frames on fds 3/4       -> ``FrameError``
- ``protocol`` erlcuda's messages to and from ETF             -> ``ProtocolError``
- ``kernels``  argument checking against the catalogue        -> ``BadArgs``
- ``backends`` cpu (numpy) and cuda (PyCUDA) devices          -> ``BackendError``
- ``lanes``    one thread per device, batching
- ``worker``   routing, control calls
- ``portenv``  what serve needs of its process (fds, parent)  -> ``PortEnvError``
"""

__version__ = "0.5.2"
