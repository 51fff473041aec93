%% The Erlang node of `bench/cluster': erlcuda on several BEAM nodes of one host.
%%
%% `main(ConfigFile)' reads one map (`file:consult/1' syntax, written by bench/cluster.py).
%% This node (distributed, started by bench/cluster.py) runs erlcuda itself and starts
%% `peers' more nodes with OTP's peer module, each running erlcuda with the same backend
%% (on a host with several GPUs, peer K sees GPU K only: CUDA_VISIBLE_DEVICES; this node
%% then sees GPU 0). It writes one JSON object a line on stdout: `{"event":"result",...}'
%% per measurement, `{"event":"info",...}', `{"event":"done"}' or `{"event":"error",...}'.
%%
%%   latency     `launch_sync' of vector_add on this node and on a peer (`{node, Peer}'),
%%               job by job in one shuffled order, for each size: the remote overhead is the
%%               difference of the two;
%%   throughput  1000 callers on this node looping `launch_sync' for a fixed time, local
%%               only, then `{node, any}' over every node: vector_add 1000, matmul, and
%%               on GPUs a user kernel that spins on each element (`spin_iters').
-module(erlcuda_cluster_bench).

-export([main/1]).

-define(TIMEOUT, 60000).

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    erlcuda_bench_io:main(ConfigFile, fun run/1).

run(#{backend := Backend, peers := NPeers, sizes := Sizes, reps := Reps, callers := Callers,
      seconds := Seconds, python := Python, gpus := Gpus} = Config) ->
    logger:set_primary_config(level, error),
    Env = [{backend, Backend}, {python, Python}, {max_queue, 100000},
           {cpu_devices, maps:get(cpu_devices, Config, 1)}],
    start_local(Env, Gpus),
    Peers = [start_peer(K, Env, Gpus) || K <- lists:seq(1, NPeers)],
    Nodes = [node() | [N || {_, N} <- Peers]],
    ok = wait_cluster(Nodes, 200),
    erlcuda_bench_io:emit(#{event => info, nodes => [atom_to_binary(N) || N <- Nodes],
           backend => maps:get(backend, erlcuda:info()),
           devices => [rpc_devices(N) || N <- Nodes]}),
    [_, Remote | _] = Nodes,
    [latency(Size, Reps, Remote) || Size <- Sizes],
    Small = floats(1000),
    Job = fun(Opts) -> {ok, _} = erlcuda:launch_sync(vector_add, [Small, Small],
                                                     [{format, binary}, {timeout, ?TIMEOUT}
                                                      | Opts])
          end,
    Pair = fun(Kernel, F) ->
                   throughput(local, Kernel, Callers, Seconds, [node()], fun() -> F([]) end),
                   throughput(cluster, Kernel, Callers, Seconds, Nodes,
                              fun() -> F([{node, any}]) end)
           end,
    Pair(vector_add, Job),
    %% 8 MiB of operands a job at 1024: their trip bounds the rate.
    M = maps:get(matmul, Config, 256),
    Square = floats(M * M),
    Pair(matmul, fun(Opts) ->
                         {ok, _} = erlcuda:launch_sync(matmul, [Square, Square, M, M, M],
                                                       [{format, binary}, {timeout, ?TIMEOUT}
                                                        | Opts])
                 end),
    %% A job whose device time outweighs its trip (a user kernel, so GPUs only): there
    %% the devices bound the rate, and the other nodes' devices can add to it.
    case maps:get(spin_iters, Config, 0) of
        Iters when Iters > 0 ->
            case maps:get(backend, erlcuda:info()) of
                cuda -> spin(Nodes, Iters, Pair);
                _ -> ok
            end;
        _ -> ok
    end,
    [peer:stop(P) || {P, _} <- Peers],
    ok.

-define(SPIN_SOURCE,
        <<"extern \"C\" __global__ void spin(float *x, int iters, long long n) {\n"
          "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
          "  if (i >= n) return;\n"
          "  float v = x[i];\n"
          "  for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;\n"
          "  x[i] = v;\n"
          "}\n">>).
-define(SPIN_ELEMENTS, 100000).

spin(Nodes, Iters, Pair) ->
    Loaded = erpc:multicall(Nodes, erlcuda, load,
                            [bench_spin, ?SPIN_SOURCE,
                             [{spin, [{inout, f32}, {scalar, i32}, {scalar, i64}]}]], 120000),
    [{ok, ok}] = lists:usort(Loaded),
    X = floats(?SPIN_ELEMENTS),
    Spin = fun(Opts) ->
                   {ok, _} = erlcuda:launch_sync(spin, [X, Iters, ?SPIN_ELEMENTS],
                                                 [{format, binary}, {timeout, ?TIMEOUT}
                                                  | Opts])
           end,
    %% One job alone: what the device takes for it, beside its trip.
    Spin([]),
    T0 = erlang:monotonic_time(nanosecond),
    [Spin([]) || _ <- lists:seq(1, 20)],
    erlcuda_bench_io:emit(#{event => spin, spin_iters => Iters, spin_elements => ?SPIN_ELEMENTS,
                            spin_lone_ns => (erlang:monotonic_time(nanosecond) - T0) div 20}),
    Pair(spin, Spin).

start_local(Env, Gpus) ->
    Gpus > 1 andalso os:putenv("CUDA_VISIBLE_DEVICES", "0"),
    ok = application:load(erlcuda),
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    {ok, _} = application:ensure_all_started(erlcuda),
    ok.

start_peer(K, Env, Gpus) ->
    Name = list_to_atom("erlcuda_bench_peer" ++ integer_to_list(K)),
    Paths = lists:append([["-pa", P] || P <- code:get_path(), lists:prefix(cwd(), P)]),
    PeerEnv = case Gpus > K of
                  true -> [{"CUDA_VISIBLE_DEVICES", integer_to_list(K)}];
                  false -> []
              end,
    [_, Host] = string:split(atom_to_list(node()), "@"),
    %% Controlled over stdio: the peer's erlcuda finds this node's through distribution.
    {ok, P, Node} = peer:start_link(#{name => Name, host => Host, env => PeerEnv,
                                      longnames => net_kernel:longnames(),
                                      connection => standard_io, wait_boot => 60000,
                                      args => ["-setcookie", atom_to_list(erlang:get_cookie())
                                               | Paths]}),
    ok = peer:call(P, application, load, [erlcuda]),
    [ok = peer:call(P, application, set_env, [erlcuda, Key, V]) || {Key, V} <- Env],
    {ok, _} = peer:call(P, application, ensure_all_started, [erlcuda], 120000),
    true = net_kernel:connect_node(Node),
    {P, Node}.

cwd() ->
    {ok, D} = file:get_cwd(),
    D.

wait_cluster(_, 0) ->
    {error, cluster_incomplete};
wait_cluster(Nodes, N) ->
    Known = [Node || #{node := Node} <- cluster_nodes()],
    case lists:all(fun(Node) -> lists:member(Node, Known) end, Nodes) of
        true -> ok;
        false -> timer:sleep(100), wait_cluster(Nodes, N - 1)
    end.

cluster_nodes() ->
    case erlcuda:info(cluster) of
        #{nodes := L} when is_list(L) -> L;
        L when is_list(L) -> L;
        M when is_map(M) -> [V#{node => K} || {K, V} <- maps:to_list(M), is_map(V)]
    end.

rpc_devices(Node) ->
    maps:get(devices, erpc:call(Node, erlcuda, info, [])).

node_jobs(Node) ->
    #{device_info := Devices} = erpc:call(Node, erlcuda, info, []),
    lists:sum([maps:get(jobs, D, 0) || D <- Devices]).

%% Local and remote calls of one size, shuffled job by job.
latency(Size, Reps, Remote) ->
    A = floats(Size),
    Opts = [{format, binary}, {timeout, ?TIMEOUT}],
    Call = fun(local) -> {ok, _} = erlcuda:launch_sync(vector_add, [A, A], Opts);
              (remote) -> {ok, _} = erlcuda:launch_sync(vector_add, [A, A],
                                                        [{node, Remote} | Opts])
           end,
    [Call(W) || W <- [local, remote, local, remote]],  % warm-up
    Order = shuffle(lists:append(lists:duplicate(Reps, [local, remote]))),
    Samples = [{W, begin
                       T0 = erlang:monotonic_time(nanosecond),
                       Call(W),
                       erlang:monotonic_time(nanosecond) - T0
                   end} || W <- Order],
    erlcuda_bench_io:emit(#{event => result, section => latency, size => Size,
           local_ns => [T || {local, T} <- Samples],
           remote_ns => [T || {remote, T} <- Samples]}).

throughput(Mode, Kernel, Callers, Seconds, Nodes, Job) ->
    Job(),
    Before = [node_jobs(N) || N <- Nodes],
    Parent = self(),
    Deadline = erlang:monotonic_time(millisecond) + Seconds * 1000,
    T0 = erlang:monotonic_time(nanosecond),
    Pids = [spawn_link(fun() -> Parent ! {done, self(), loop(Job, Deadline, 0)} end)
            || _ <- lists:seq(1, Callers)],
    Jobs = lists:sum([receive {done, P, N} -> N end || P <- Pids]),
    Wall = erlang:monotonic_time(nanosecond) - T0,
    Spread = [#{node => atom_to_binary(N), jobs => node_jobs(N) - B}
              || {N, B} <- lists:zip(Nodes, Before)],
    erlcuda_bench_io:emit(#{event => result, section => throughput, mode => Mode,
                            kernel => Kernel, callers => Callers, jobs => Jobs,
                            wall_ns => Wall, spread => Spread}).

loop(Job, Deadline, N) ->
    case erlang:monotonic_time(millisecond) >= Deadline of
        true -> N;
        false -> Job(), loop(Job, Deadline, N + 1)
    end.

floats(Size) ->
    << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(1, Size) >>.

shuffle(L) ->
    [X || {_, X} <- lists:sort([{rand:uniform(), X} || X <- L])].

