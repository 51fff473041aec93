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
%%               the transports); the info event carries that probe's figures. At each size,
%%               in blocks that take turns `rounds' times (events of sections `bus',
%%               `floors' and `cupy'): erlcuda; the lean floor doing the same vector_add
%%               (erlcuda_lone), its operands through its port and through memory shared
%%               with it (one `file:pwrite' of both operands into its file, a request of 5
%%               bytes, one `file:pread' of the result, which its GPU copies wrote into the
%%               file's pinned pages), what any design of either transport costs at least;
%%               and, on the cuda backend, CuPy from numpy (bench/cupy_peer.py, a port of
%%               this node that times its own calls);
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

%% vector_add at each size, then reduce: erlcuda, the lean floor (vector_add) and CuPy
%% (on the cuda backend) take turns in blocks, so that each ratio compares times of the same
%% minutes of the machine.
bus(#{sizes := Sizes, reduce_size := ReduceSize} = Config) ->
    Max = lists:max([ReduceSize | Sizes]),
    File = filename:join(shm_dir(), "erlcuda-lean-floor-" ++ os:getpid()),
    Cupy = open_cupy(Config),
    erlcuda_bench_io:emit(#{event => reference, cupy => case Cupy of
                                                           {_, What} -> What;
                                                           none -> <<"not run">>
                                                       end}),
    try
        Floor = open_floor(Config, Max, File),
        try
            [turns(sides(vector_add, N, Floor, Cupy), Config) || N <- Sizes],
            turns(sides(reduce, ReduceSize, none, Cupy), Config),
            ok
        after
            close_floor(Floor)
        end
    after
        _ = file:delete(File),
        close_cupy(Cupy)
    end.

%% The floor's port and the file it shares, or `none' where the run has no lean floor.
open_floor(#{lone := Lone, python := Python}, Max, File) ->
    Floor = erlcuda_lone:open(Lone#{python => Python, size => Max, shm => File}),
    {ok, Fd} = file:open(File, [read, write, raw, binary]),
    #{port => maps:get(port, Floor), floor => Floor, fd => Fd, max => Max};
open_floor(_, _, _) ->
    none.

%% Whatever ended the run, a port already gone included: its own error is the one shown.
close_floor(none) ->
    ok;
close_floor(#{floor := Floor, fd := Fd}) ->
    _ = file:close(Fd),
    _ = catch erlcuda_lone:close(Floor),
    ok.

shm_dir() ->
    case filelib:is_dir("/dev/shm") of
        true -> "/dev/shm";
        false -> filename:basedir(user_cache, "erlcuda")
    end.

%% CuPy from numpy in a port of its own (bench/cupy_peer.py), on the cuda backend where it
%% loads: `{Port, Version}', or `none'.
open_cupy(#{backend := Backend, python := Python, cupy_script := Script}) ->
    case maps:get(backend, erlcuda:info()) of
        cuda when Backend =/= cpu ->
            Port = open_port({spawn_executable, Python},
                             [{args, [Script]}, {packet, 4}, binary, nouse_stdio,
                              exit_status]),
            receive
                {Port, {data, <<"reference=none">>}} -> close_cupy({Port, none}), none;
                {Port, {data, <<"reference=", What/binary>>}} -> {Port, What};
                {Port, {exit_status, S}} -> error({cupy_peer_exited, S})
            after 120000 -> error(cupy_peer_no_hello)
            end;
        _ ->
            none
    end;
open_cupy(_) ->
    none.

close_cupy(none) -> ok;
close_cupy({Port, _}) -> _ = catch port_close(Port), ok.

%% One request to the CuPy peer: the `Count' samples it timed.
cupy_call(Port, Request, Count) ->
    true = port_command(Port, Request),
    receive
        {Port, {data, Samples}} when byte_size(Samples) =:= 8 * Count ->
            [S || <<S:64/little>> <= Samples];
        {Port, {data, Other}} -> error({cupy_peer_answered, byte_size(Other), Count});
        {Port, {exit_status, S}} -> error({cupy_peer_exited, S})
    after ?TIMEOUT -> error(cupy_peer_timeout)
    end.

%% What takes turns at one size: `{Event, Run}', Run(Count) giving Count samples in ns.
sides(Kernel, N, Floor, Cupy) ->
    A = vec(N, 1),
    Args = case Kernel of
               reduce -> [A];
               vector_add -> [A, vec(N, 2)]
           end,
    ok = check(Kernel, N, Args),
    Bytes = #{event => result, kernel => Kernel, size => N,
              bytes_in => 4 * N * length(Args),
              bytes_out => case Kernel of reduce -> 8; _ -> 4 * N end},
    Call = fun() -> {ok, _} = erlcuda:launch_sync(Kernel, Args, ?OPTS) end,
    [{Bytes#{section => bus}, local(Call)}]
        ++ floor_sides(Kernel, N, Args, Floor, Bytes)
        ++ cupy_side(Kernel, N, Cupy).

floor_sides(vector_add, N, [A, B] = Args, #{port := Port, fd := Fd, max := Max}, Bytes) ->
    Calls = #{pipe => fun() -> erlcuda_lone:call(Port, [<<0, N:32/little>>, A, B]) end,
              shm => fun() ->
                             ok = file:pwrite(Fd, [{0, A}, {4 * Max, B}]),
                             <<"k">> = erlcuda_lone:call(Port, <<2, N:32/little>>),
                             {ok, C} = file:pread(Fd, 8 * Max, 4 * N),
                             C
                     end},
    {ok, Want} = erlcuda:launch_sync(vector_add, Args, ?OPTS),
    [begin
         Want = Call(),
         {Bytes#{section => floors, transport => T}, local(Call)}
     end || {T, Call} <- maps:to_list(Calls)];
floor_sides(_, _, _, _, _) ->
    [].

cupy_side(_, _, none) ->
    [];
cupy_side(Kernel, N, {Port, _}) ->
    K = case Kernel of vector_add -> 0; reduce -> 1 end,
    Run = fun(Count) -> cupy_call(Port, <<K, N:32/little, Count:32/little>>, Count) end,
    [{#{event => result, section => cupy, kernel => Kernel, size => N}, Run}].

local(Call) ->
    fun(Count) -> [begin T = now_ns(), Call(), now_ns() - T end || _ <- lists:seq(1, Count)] end.

%% Each side warmed up and its block's length set from its warm-up (as many calls as fit
%% its budget, between min_iters and max_iters, over the rounds); then `rounds' rounds, each
%% side's block in turn, the order turned by one side each round. A block's first call
%% follows another side's work (other caches, another process woken) and is not timed: a
%% side's samples are its calls that follow its own, as in a run of one kind of job. One
%% event a side, with every sample, in the order taken.
turns(Sides, #{warmup := Warmup, rounds := Rounds} = Config) ->
    Indexed = lists:zip(lists:seq(1, length(Sides)), Sides),
    Blocks = maps:from_list(
               [begin
                    Iters = iters(median(Run(max(1, Warmup))), Config),
                    {I, max(1, (Iters + Rounds - 1) div max(1, Rounds))}
                end || {I, {_, Run}} <- Indexed]),
    Samples = lists:foldl(
                fun(R, Acc) ->
                        {Front, Back} = lists:split(R rem length(Indexed), Indexed),
                        lists:foldl(fun({I, {_, Run}}, In) ->
                                            _ = Run(1),
                                            Block = Run(maps:get(I, Blocks)),
                                            maps:update_with(I, fun(Got) -> Got ++ Block end,
                                                             In)
                                    end, Acc, Back ++ Front)
                end, maps:from_list([{I, []} || {I, _} <- Indexed]),
                lists:seq(0, max(1, Rounds) - 1)),
    [erlcuda_bench_io:emit(Event#{samples_ns => maps:get(I, Samples)})
     || {I, {Event, _}} <- Indexed],
    ok.

median(Samples) ->
    lists:nth((length(Samples) + 1) div 2, lists:sort(Samples)).

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
timed(Call, #{warmup := Warmup} = Config) ->
    T0 = now_ns(),
    _ = [Call() || _ <- lists:seq(1, Warmup)],
    Iters = iters((now_ns() - T0) div max(Warmup, 1), Config),
    [begin T = now_ns(), Call(), now_ns() - T end || _ <- lists:seq(1, Iters)].

%% How many calls of `PerNs' each fit the budget, between min_iters and max_iters.
iters(PerNs, #{budget_s := Budget, min_iters := Min, max_iters := Max}) ->
    max(Min, min(Max, trunc(Budget * 1.0e9 / max(1, PerNs)))).

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
