%% The Erlang node of `bench/bus': host data at the speed of the bus, timed from Erlang.
%%
%% `main(ConfigFile)' reads one map (`file:consult/1' syntax, written by bench/bus.py),
%% starts erlcuda with the backend it names (the benchmarks' worker, for its `transfers'
%% call) and writes one JSON object a line on stdout (erlcuda_bench_io). Every sample is one
%% `launch_sync''s wall time in nanoseconds, binaries in and out (`{format, binary}').
%%
%% Sections, in this order:
%%   bus         vector_add at each of `sizes' elements and reduce of `reduce_size', with
%%               the defaults (`shm_threshold' auto: the application's first start measured
%%               the transports); the info event carries that probe's figures;
%%   floors      vector_add at each of `sizes' by the lean floor (erlcuda_lone): its
%%               operands through its port, and through memory shared with it (one
%%               `file:pwrite' of both operands into its file, a request of 5 bytes, one
%%               `file:pread' of the result, which its GPU copies wrote into the file's
%%               pinned pages); what any design of either transport costs at least;
%%   lone        lone 1000-element jobs against the lean floor, in blocks (erlcuda_lone);
%%   transfers   (with `probe') the worker's copies of a fresh mapping on its device at each
%%               of `transfer_sizes' bytes: staged, registered for the copy, registered
%%               beforehand (the benchmarks' worker's `transfers' call; none on the CPU);
%%   transports  (with `probe') vector_add with operands of each of `transport_sizes'
%%               bytes, everything through the pipe (the application restarted with a
%%               threshold above them), then everything through shared memory (threshold
%%               4096).
-module(erlcuda_bus).

-export([main/1]).

-define(TIMEOUT, 600000).
-define(OPTS, [{format, binary}, {timeout, ?TIMEOUT}]).
-define(BLOCK, 65536).

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    erlcuda_bench_io:main(ConfigFile, fun run/1).

run(Config) ->
    logger:set_primary_config(level, error),
    ok = start(Config, auto),
    erlcuda_bench_io:emit(info(Config)),
    bus(Config),
    floors(Config),
    lone(Config),
    case maps:get(probe, Config, false) of
        true -> transfers(Config), transports(Config);
        false -> ok
    end.

%% The application with the run's backend and the benchmarks' worker; restarted with
%% another `shm_threshold' for the transports.
start(#{backend := Backend, python := Python, worker_path := WorkerPath}, Threshold) ->
    _ = application:stop(erlcuda),
    _ = application:load(erlcuda),
    Env = [{backend, Backend}, {python, Python}, {shm_threshold, Threshold},
           {worker_module, "erlcuda_benchworker"}, {python_path, [WorkerPath]},
           {max_queue, 100000}],
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    {ok, _} = application:ensure_all_started(erlcuda),
    case erlcuda:info() of
        #{worker_status := up, status := ok} -> ok;
        Info -> error({erlcuda_not_ready, maps:with([worker_status, status, reason], Info)})
    end.

info(Config) ->
    Info = erlcuda:info(),
    Devices = [maps:with([name, total_memory, compute_capability, pinned_bytes,
                          register_min], D) || D <- maps:get(device_info, Info, [])],
    #{event => info, backend => maps:get(backend, Info), devices => Devices,
      shm_threshold => threshold(maps:get(shm_threshold, Info)),
      shm_probe => [#{bytes => S, pipe_us => P, shm_us => M}
                    || {S, P, M} <- maps:get(shm_figures, Info, [])],
      otp_release => list_to_binary(erlang:system_info(otp_release)),
      schedulers => erlang:system_info(schedulers_online),
      requested_backend => maps:get(backend, Config)}.

threshold(none) -> 0;
threshold(T) -> T.

%% vector_add at each size, then reduce.
bus(#{sizes := Sizes, reduce_size := ReduceSize} = Config) ->
    [sample(vector_add, N, Config) || N <- Sizes],
    sample(reduce, ReduceSize, Config),
    ok.

sample(Kernel, N, Config) ->
    A = vec(N, 1),
    Args = case Kernel of
               reduce -> [A];
               vector_add -> [A, vec(N, 2)]
           end,
    ok = check(Kernel, N, Args),
    Call = fun() -> {ok, _} = erlcuda:launch_sync(Kernel, Args, ?OPTS) end,
    Samples = timed(Call, Config),
    erlcuda_bench_io:emit(#{event => result, section => bus, kernel => Kernel, size => N,
                            bytes_in => 4 * N * length(Args),
                            bytes_out => case Kernel of reduce -> 8; _ -> 4 * N end,
                            samples_ns => Samples}).

%% The answer is right at both ends and in the middle (small integers: exact in f32).
check(vector_add, N, Args) ->
    {ok, C} = erlcuda:launch_sync(vector_add, Args, ?OPTS),
    N = byte_size(C) div 4,
    [true = element_of(C, I) == value(I, 1) + value(I, 2) || I <- places(N)],
    ok;
check(reduce, N, Args) ->
    {ok, Sum} = erlcuda:launch_sync(reduce, Args, ?OPTS),
    Block = min(N, ?BLOCK),  % vec/2 repeats a block of this many
    Want = lists:sum([value(I, 1) || I <- lists:seq(0, Block - 1)]) * (N div Block)
        + lists:sum([value(I, 1) || I <- lists:seq(0, N rem Block - 1)]),
    true = abs(Sum - Want) =< 1.0e-5 * abs(Want) + 1.0,
    ok.

places(N) -> lists:usort([0, N div 2, N - 1]).

element_of(Bin, I) ->
    <<X:32/float-little>> = binary:part(Bin, 4 * I, 4),
    X.

%% Warm-up calls, then as many as fit the budget (between min_iters and max_iters).
timed(Call, #{warmup := Warmup, budget_s := Budget, min_iters := Min, max_iters := Max}) ->
    T0 = now_ns(),
    _ = [Call() || _ <- lists:seq(1, Warmup)],
    Per = max(1, (now_ns() - T0) div max(Warmup, 1)),
    Iters = max(Min, min(Max, trunc(Budget * 1.0e9 / Per))),
    [begin T = now_ns(), Call(), now_ns() - T end || _ <- lists:seq(1, Iters)].

%% The lean floor at each size, through its port and through its shared file.
floors(#{sizes := Sizes, lone := Lone} = Config) ->
    Max = lists:max(Sizes),
    File = filename:join(shm_dir(), "erlcuda-lean-floor-" ++ os:getpid()),
    Floor = erlcuda_lone:open(Lone#{python => maps:get(python, Config), size => Max,
                                    shm => File}),
    {ok, Fd} = file:open(File, [read, write, raw, binary]),
    try
        [floor_sample(maps:get(port, Floor), Fd, Max, N, Config) || N <- Sizes],
        ok
    after
        ok = file:close(Fd),
        erlcuda_lone:close(Floor),
        _ = file:delete(File)
    end;
floors(_) ->
    ok.

shm_dir() ->
    case filelib:is_dir("/dev/shm") of
        true -> "/dev/shm";
        false -> filename:basedir(user_cache, "erlcuda")
    end.

floor_sample(Port, Fd, Max, N, Config) ->
    A = vec(N, 1), B = vec(N, 2),
    Calls = #{pipe => fun() -> erlcuda_lone:call(Port, [<<0, N:32/little>>, A, B]) end,
              shm => fun() ->
                             ok = file:pwrite(Fd, [{0, A}, {4 * Max, B}]),
                             <<"k">> = erlcuda_lone:call(Port, <<2, N:32/little>>),
                             {ok, C} = file:pread(Fd, 8 * Max, 4 * N),
                             C
                     end},
    {ok, Want} = erlcuda:launch_sync(vector_add, [A, B], ?OPTS),
    [begin
         Want = Call(),
         erlcuda_bench_io:emit(#{event => result, section => floors, transport => T,
                                 kernel => vector_add, size => N, bytes_in => 8 * N,
                                 bytes_out => 4 * N, samples_ns => timed(Call, Config)})
     end || {T, Call} <- maps:to_list(Calls)].

lone(#{lone := Lone} = Config) ->
    Floor = erlcuda_lone:open(Lone#{python => maps:get(python, Config)}),
    try
        [erlcuda_bench_io:emit(E) || E <- erlcuda_lone:run(Floor, Lone)],
        erlcuda_bench_io:emit(#{event => lone_floor, backend => maps:get(backend, Floor),
                                device => maps:get(device, Floor)})
    after
        erlcuda_lone:close(Floor)
    end;
lone(_) ->
    ok.

transfers(#{transfer_sizes := Sizes}) ->
    {ok, [Rows, RegisterMin]} = erlcuda_worker:call(transfers, [0, Sizes], ?TIMEOUT),
    erlcuda_bench_io:emit(
      #{event => result, section => transfers, register_min => RegisterMin,
        rows => [#{bytes => B, staged_in_s => S, registered_in_s => R, pinned_in_s => P,
                   staged_out_s => SO, pinned_out_s => PO}
                 || [B, S, R, P, SO, PO] <- Rows]}).

%% The same vector_adds through each transport alone.
transports(#{transport_sizes := Sizes} = Config) ->
    [begin
         ok = start(Config, Threshold),
         [begin
              N = Bytes div 4,
              Args = [vec(N, 1), vec(N, 2)],
              Call = fun() -> {ok, _} = erlcuda:launch_sync(vector_add, Args, ?OPTS) end,
              erlcuda_bench_io:emit(#{event => result, section => transports,
                                      transport => Transport, bytes => Bytes,
                                      samples_ns => timed(Call, Config#{budget_s := 0.5})})
          end || Bytes <- Sizes]
     end || {Transport, Threshold} <- [{pipe, 1 bsl 40}, {shm, 4096}]],
    ok.

now_ns() -> erlang:monotonic_time(nanosecond).

%% Small integers in f32, from a repeated block (fast for 10^7 elements).
vec(N, Seed) ->
    Block = << <<(value(I, Seed)):32/float-little>> || I <- lists:seq(0, min(N, ?BLOCK) - 1) >>,
    Copies = (N + ?BLOCK - 1) div ?BLOCK,
    binary:part(binary:copy(Block, Copies), 0, 4 * N).

value(I, Seed) ->
    float(((I rem ?BLOCK) * Seed) rem 97).
