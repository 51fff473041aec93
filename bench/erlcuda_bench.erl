%% The benchmark node of `bench/run': one long-lived Erlang node with the worker attached.
%%
%% `main(ConfigFile)' reads one map (written by bench/run with `file:consult/1' syntax),
%% starts erlcuda with the application env it names (with the benchmarks' worker,
%% bench/worker/erlcuda_benchworker, for its `pure' and `echo' calls, and `python', the
%% interpreter bench/run itself runs under), runs the sections and writes one JSON object a line on stdout:
%% `{"event":"phase",...}', `{"event":"progress","done":N,"total":M}',
%% `{"event":"result","section":...}', `{"event":"info",...}', and at the end
%% `{"event":"done"}' (or `{"event":"error",...}'). Logs go to stderr, so stdout carries
%% nothing else. Times are `erlang:monotonic_time(nanosecond)'; a traced job's stamps are
%% nanoseconds by stage (`erlcuda:stamps()'), each timed on one clock.
%%
%% Sections:
%%   latency     per kernel and size, the full stack (`erlcuda:launch_sync/3') and the pure
%%               backend call timed in the worker (`erlcuda_worker:call(pure, ...)'), job by
%%               job, both kinds and all sizes shuffled into one random order;
%%   lone        lone 1000-element jobs, blocks of each kind in turn, against the lean floor
%%               (bench/lean_floor.py: pinned buffers allocated once, one stream, raw
%%               replies): vector_add on binaries and on lists, reduce of a binary
%%               (erlcuda_lone);
%%   stages      traced jobs (`{trace, true}'): where one job's time goes, plus an echo of
%%               the same input bytes as the bare transport;
%%   bandwidth   large vector_add and reduce jobs beside an echo moving the same bytes and the
%%               pure backend call, with shared memory (the default); then, at the sizes of
%%               `pipe_sizes', the same with `shm_dir' none (the application restarted), so
%%               that the pipe and shared memory are measured side by side in one run;
%%   throughput  N concurrent callers looping `launch_sync' until a deadline, batching on
%%               and off (the application is restarted with `batching' false); and the
%%               floor's unbatched pipelined rate (one process, a window of frames in flight);
%%   hold        whether a large result holds up a small job on another device: a caller
%%               loops small reduce jobs on device 1, alone (the baseline), then while one
%%               vector_add of `big_size' elements runs on device 0 and its result is
%%               delivered (`repeats' times); with shared memory and with `shm_dir' none,
%%               and for each of `calls': `launch' (`launch/3', a binary result forwarded
%%               by the port owner) and `launch_sync' (a list result its caller makes).
%%               Two devices: the cpu backend with `cpu_devices' 2 unless the worker has two
%%               GPUs or more (it measures the Erlang side, the port owner, which every
%%               backend shares);
%%   erlport     (only where bench/run was given `--erlport DIR') erlport's python:call beside
%%               erlcuda, interleaved: a tiny call, a 1000-element vector_add, 100 concurrent
%%               callers and a large payload, each repeated (medians of the repetitions).
%%
%% The floor (bench/floor.py) is the least a port peer can do to run a job: a port with
%% `{packet, 4}', `binary', `nouse_stdio', and one Python thread that reads a frame of raw
%% f32 operands, makes the same backend call as the worker (same backend, device 0) and
%% writes the raw result in one reply frame. This process owns its port and times its round
%% trips beside the full stack's and the pure call's (latency), and pipelines it (throughput).
%%
%% Only erlcuda's public API is used: erlcuda:launch/3, launch_sync/3, info/0, and
%% erlcuda_worker:call/3 for the benchmark worker's calls `pure' and `echo'.
-module(erlcuda_bench).

-export([main/1]).

-define(TIMEOUT, 600000).
-define(OPTS, [{format, binary}, {timeout, ?TIMEOUT}]).
-define(BLOCK, 65536).

-type kernel() :: vector_add | reduce | dot_product | matmul.
-type group() :: {kernel(), pos_integer()}.

%% Entry point.

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    quiet_logger(),
    try run(ConfigFile) of
        ok ->
            emit(#{event => done}),
            erlang:halt(0)
    catch
        Class:Reason:Stack ->
            emit(#{event => error,
                   message => fmt("~p:~0P", [Class, Reason, 30]),
                   stack => fmt("~0P", [Stack, 40])}),
            erlang:halt(1)
    end.

%% The default handler writes to stdout, which carries the JSON lines: logs go to stderr.
quiet_logger() ->
    _ = logger:remove_handler(default),
    ok = logger:add_handler(bench_stderr, logger_std_h,
                            #{level => warning, config => #{type => standard_error}}),
    ok.

run(ConfigFile) ->
    {ok, [Cfg0]} = file:consult(ConfigFile),
    _ = rand:seed(exsss, maps:get(seed, Cfg0, 1)),
    ok = start_app(Cfg0, #{}),
    Floor = floor_open(Cfg0),
    Cfg = Cfg0#{floor_port => Floor},
    emit(info_event(Cfg)),
    Sections = maps:get(sections, Cfg, [latency, stages, bandwidth, throughput, hold]),
    [ok = section(S, Cfg) || S <- Sections],
    floor_close(Floor).

section(latency, #{latency := L, floor_port := F}) -> latency(L, F);
section(lone, #{lone := L} = Cfg) -> lone(L, Cfg);
section(stages, #{stages := S}) -> stages(S);
section(bandwidth, #{bandwidth := B} = Cfg) -> bandwidth(B, Cfg);
section(throughput, #{throughput := T} = Cfg) -> throughput(T, Cfg);
section(hold, #{hold := H} = Cfg) -> hold(H, Cfg);
section(erlport, #{erlport := E} = Cfg) -> erlport(E, Cfg);
section(_, _) -> ok.

%% The application: the run's env, with `Over' (batching, shm_dir, backend, cpu_devices)
%% changing some of it; every key is set at each start, so a restart undoes the last one's.

start_app(Cfg, Over) ->
    _ = application:load(erlcuda),
    %% The benchmarks' worker (bench/worker/erlcuda_benchworker) answers the calls pure and
    %% echo; it is found beside this source file.
    Env = [{backend, maps:get(backend, Over, maps:get(backend, Cfg, auto))},
           {cpu_devices, maps:get(cpu_devices, Over, 1)},
           {max_queue, maps:get(max_queue, Cfg, 100000)},
           {batching, maps:get(batching, Over, true)},
           {shm_dir, maps:get(shm_dir, Over, auto)},
           {worker_module, "erlcuda_benchworker"},
           {python_path, [filename:join(filename:dirname(?FILE), "worker")]}
           | [{python, P} || P <- [maps:get(python, Cfg, default)], is_list(P)]],
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    {ok, _} = application:ensure_all_started(erlcuda),
    case erlcuda:info() of
        #{worker_status := up, status := ok} -> ok;
        Info -> error({erlcuda_not_ready, maps:with([worker_status, status, reason], Info)})
    end.

restart_app(Cfg, Over) ->
    ok = application:stop(erlcuda),
    start_app(Cfg, Over).

%% Whether the running worker has a shared-memory folder: `shm_dir' not none and the
%% port owner's folder (`erlcuda-<OsPid>-<N>' under the base) there.
shm_active() ->
    Base = case application:get_env(erlcuda, shm_dir, auto) of
               none -> none;
               auto -> "/dev/shm";
               B when is_binary(B) -> binary_to_list(B);
               B -> B
           end,
    Base =/= none andalso
        filelib:wildcard("erlcuda-" ++ os:getpid() ++ "-*", Base) =/= [].

shm_threshold() ->
    application:get_env(erlcuda, shm_threshold, 1048576).

info_event(Cfg) ->
    Info = erlcuda:info(),
    Devices = maps:get(device_info, Info, []),
    Name = case Devices of
               [#{name := N} | _] -> N;
               _ -> <<"unknown">>
           end,
    %% bench/run names the interpreter and sets ERLCUDA_PYTHON to it as well.
    Python = maps:get(python, Cfg, os:getenv("ERLCUDA_PYTHON", "python3")),
    #{event => info,
      requested_backend => maps:get(backend, Cfg, auto),
      backend => maps:get(backend, Info),
      reason => maps:get(reason, Info, <<>>),
      devices => maps:get(devices, Info),
      device_name => Name,
      device_info => Devices,
      batching => maps:get(batching, Info, true),
      shm => shm_active(),
      shm_threshold => shm_threshold(),
      worker_python_version => maps:get(python, Info, <<>>),
      worker_python => unicode:characters_to_binary(Python),
      otp_release => list_to_binary(erlang:system_info(otp_release)),
      otp_version => otp_version(),
      erts_version => list_to_binary(erlang:system_info(version)),
      schedulers => erlang:system_info(schedulers_online),
      floor => maps:without([port, kernels], maps:get(floor_port, Cfg))}.

otp_version() ->
    File = filename:join([code:root_dir(), "releases", erlang:system_info(otp_release),
                          "OTP_VERSION"]),
    case file:read_file(File) of
        {ok, V} -> string:trim(V);
        {error, _} -> list_to_binary(erlang:system_info(otp_release))
    end.

%% Inputs: random f32 blocks repeated to the size wanted (fast for 10^7 elements).

-spec vec(non_neg_integer()) -> binary().
vec(N) ->
    fill(rand_block(min(max(N, 1), ?BLOCK)), N * 4).

rand_block(N) ->
    << <<(rand:uniform() * 2 - 1):32/float-little>> || _ <- lists:seq(1, N) >>.

fill(_Block, 0) ->
    <<>>;
fill(Block, Bytes) ->
    Copies = (Bytes + byte_size(Block) - 1) div byte_size(Block),
    binary:part(binary:copy(Block, Copies), 0, Bytes).

-spec args(group()) -> list().
args({matmul, N}) -> [vec(N * N), vec(N * N), N, N, N];
args({reduce, N}) -> [vec(N)];
args({_, N}) -> [vec(N), vec(N)].

elements({matmul, N}) -> N * N;
elements({_, N}) -> N.

bytes_in(Args) -> lists:sum([byte_size(B) || B <- Args, is_binary(B)]).

bytes_out({matmul, N}) -> 4 * N * N;
bytes_out({vector_add, N}) -> 4 * N;
bytes_out(_) -> 8.

%% The bytes a large-payload job is counted for: a vector_add's inputs and result, a
%% reduce's input (its result is one float).
bytes_per_job({reduce, _}, Args) -> bytes_in(Args);
bytes_per_job(G, Args) -> bytes_in(Args) + bytes_out(G).

%% Single timed calls.

now_ns() -> erlang:monotonic_time(nanosecond).

full(K, Args) ->
    T0 = now_ns(),
    case erlcuda:launch_sync(K, Args, ?OPTS) of
        {ok, _} -> now_ns() - T0;
        {error, Why} -> error({launch_failed, K, Why})
    end.

pure(K, Args, Repeat) ->
    case erlcuda_worker:call(pure, [0, K, Args, Repeat], ?TIMEOUT) of
        {ok, Ns} when is_list(Ns) -> Ns;
        Other -> error({pure_failed, K, Other})
    end.

echo(Bin) ->
    T0 = now_ns(),
    case erlcuda_worker:call(echo, [Bin], ?TIMEOUT) of
        {ok, Back} when byte_size(Back) =:= byte_size(Bin) -> now_ns() - T0;
        Other -> error({echo_failed, byte_size(Bin), Other})
    end.

%% The floor: bench/floor.py behind a port owned by this process (see the module doc).

-type floor() :: #{port := port(), kernels := #{atom() => non_neg_integer()},
                   backend := binary(), atom() => term()}.

-spec floor_open(map()) -> floor().
floor_open(#{floor := #{script := Script}} = Cfg) ->
    Backend = case maps:get(backend, erlcuda:info()) of
                  B when is_atom(B) -> atom_to_list(B);
                  B when is_binary(B) -> binary_to_list(B)
              end,
    Python = python_executable(Cfg),
    PythonDir = python_dir(Cfg),
    PythonPath = string:join([PythonDir | [P || P <- [os:getenv("PYTHONPATH", "")], P =/= ""]],
                             ":"),
    Port = open_port({spawn_executable, Python},
                     [{args, [Script, "--backend", Backend]}, {packet, 4}, binary,
                      nouse_stdio, exit_status, {env, [{"PYTHONPATH", PythonPath}]}]),
    Hello = receive
                {Port, {data, H}} -> hello(H);
                {Port, {exit_status, S}} -> error({floor_exited, S})
            after 120000 -> error(floor_no_hello)
            end,
    BackendBin = list_to_binary(Backend),
    case Hello of
        #{<<"error">> := Why} -> error({floor_failed, Why});
        #{<<"backend">> := BackendBin} -> ok;
        _ -> error({floor_backend, maps:get(<<"backend">>, Hello, none), BackendBin})
    end,
    Names = binary:split(maps:get(<<"kernels">>, Hello), <<",">>, [global]),
    Kernels = maps:from_list([{binary_to_atom(N, utf8), I - 1} || {I, N} <- enumerate(Names)]),
    #{port => Port, kernels => Kernels, backend => BackendBin,
      device => maps:get(<<"device">>, Hello, <<"?">>), python_dir => list_to_binary(PythonDir),
      script => list_to_binary(Script)}.

hello(Bin) ->
    maps:from_list([list_to_tuple(binary:split(L, <<"=">>))
                    || L <- binary:split(Bin, <<"\n">>, [global]), L =/= <<>>]).

floor_close(#{port := Port}) ->
    port_close(Port),
    ok.

python_executable(Cfg) ->
    Python = case maps:get(python, Cfg, default) of
                 P when is_list(P) -> P;
                 _ -> os:getenv("ERLCUDA_PYTHON", "python3")
             end,
    case filename:pathtype(Python) of
        absolute -> Python;
        _ -> case os:find_executable(Python) of
                 false -> error({no_python, Python});
                 Found -> Found
             end
    end.

%% Where erlcuda's Python package is: the application's priv copy (what the worker loads
%% when the build made one), else the source tree's python/ that bench/run names.
python_dir(Cfg) ->
    Priv = case code:priv_dir(erlcuda) of
               {error, _} -> none;
               D -> filename:join(D, "python")
           end,
    Package = filename:join([Priv, "erlcuda", "kernels.py"]),
    case Priv =/= none andalso filelib:is_regular(Package) of
        true -> Priv;
        false -> maps:get(python_dir, Cfg)
    end.

%% A request frame: <<KernelIndex:8, NArgs:8, 0:48>>, then each operand as
%% <<Tag:8, 0:24, Len:32/little, Bytes:Len>> and zeros to a multiple of 8 bytes (tag 0: an
%% f32 vector, 1: a dim as a 64-bit unsigned integer): the floor's numpy views are aligned.
floor_frame(Index, Args) ->
    [<<Index:8, (length(Args)):8, 0:48>> | [operand(A) || A <- Args]].

operand(B) when is_binary(B) ->
    Size = byte_size(B),
    case Size rem 8 of
        0 -> [<<0:8, 0:24, Size:32/little>>, B];
        R -> [<<0:8, 0:24, Size:32/little>>, B, <<0:((8 - R) * 8)>>]
    end;
operand(I) when is_integer(I) -> <<1:8, 0:24, 8:32/little, I:64/little>>.

%% One round trip: the frame built, written, the reply read (its size checked).
floor_call(#{port := Port, kernels := Ks}, K, Args, OutBytes) ->
    T0 = now_ns(),
    true = port_command(Port, floor_frame(maps:get(K, Ks), Args)),
    receive
        {Port, {data, <<0, Result/binary>>}} when byte_size(Result) =:= OutBytes ->
            now_ns() - T0;
        {Port, {data, Other}} -> error({floor_failed, K, Other});
        {Port, {exit_status, S}} -> error({floor_exited, S})
    after ?TIMEOUT -> error({floor_timeout, K})
    end.

%% Result bytes of a floor reply: a vector's f32s, or one f64 for a scalar.
floor_out({matmul, N}) -> 4 * N * N;
floor_out({vector_add, N}) -> 4 * N;
floor_out(_) -> 8.

%% The floor's unbatched pipelined rate: `Window' frames in flight from this one process,
%% a new one sent for each reply until the deadline, then the rest drained; jobs/s over
%% the time until the last reply.
floor_pipelined(#{port := Port, kernels := Ks}, K, Args, OutBytes, Window, Ms) ->
    Index = maps:get(K, Ks),
    Send = fun() -> true = port_command(Port, floor_frame(Index, Args)) end,
    Start = now_ns(),
    Deadline = Start + Ms * 1000000,
    _ = [Send() || _ <- lists:seq(1, Window)],
    Jobs = pipeline(Port, K, OutBytes, Send, Deadline, Window, 0),
    Elapsed = now_ns() - Start,
    #{jobs => Jobs, errors => 0, elapsed_ns => Elapsed, window => Window,
      jobs_per_s => Jobs / (Elapsed / 1.0e9)}.

pipeline(_Port, _K, _OutBytes, _Send, _Deadline, 0, Done) ->
    Done;
pipeline(Port, K, OutBytes, Send, Deadline, InFlight, Done) ->
    receive
        {Port, {data, <<0, Result/binary>>}} when byte_size(Result) =:= OutBytes ->
            case now_ns() < Deadline of
                true ->
                    Send(),
                    pipeline(Port, K, OutBytes, Send, Deadline, InFlight, Done + 1);
                false ->
                    pipeline(Port, K, OutBytes, Send, Deadline, InFlight - 1, Done + 1)
            end;
        {Port, {data, Other}} -> error({floor_failed, K, Other});
        {Port, {exit_status, S}} -> error({floor_exited, S})
    after ?TIMEOUT -> error({floor_timeout, K})
    end.

%% Warm-up: at least two calls, up to `Max' or `Budget' ns; the median wall time of a call.
warm(Fun, Max, BudgetNs) ->
    Start = now_ns(),
    warm(Fun, Max, Start + BudgetNs, []).

warm(Fun, Left, Until, Acc) when length(Acc) < 2; Left > 0 ->
    T = Fun(),
    case now_ns() >= Until andalso length(Acc) >= 1 of
        true -> median([T | Acc]);
        false -> warm(Fun, Left - 1, Until, [T | Acc])
    end;
warm(_, _, _, Acc) ->
    median(Acc).

iterations(PerIterNs, #{budget_s := Budget, min_iters := Min, max_iters := Max}) ->
    Fit = trunc(Budget * 1.0e9 / max(PerIterNs, 1)),
    max(Min, min(Max, Fit)).

%% Latency: the full stack against the pure backend path and the floor, job by job in
%% random order; the floor's round trips timed here, in the process that owns its port.

latency(#{groups := Groups, warmup := Warmup} = L, Floor) ->
    phase(<<"warm-up">>, length(Groups)),
    Prepared = [begin
                    Args = args(G),
                    {K, _} = G,
                    Out = floor_out(G),
                    FullNs = warm(fun() -> full(K, Args) end, Warmup, 1000000000),
                    %% The backend's own warm-up (caches, allocations), about a second at most.
                    _ = pure(K, Args, max(1, min(Warmup, 1000000000 div max(FullNs, 1)))),
                    PureWall = warm(fun() -> T0 = now_ns(), _ = pure(K, Args, 1),
                                             now_ns() - T0 end, Warmup, 1000000000),
                    FloorNs = warm(fun() -> floor_call(Floor, K, Args, Out) end, Warmup,
                                   1000000000),
                    step(),
                    {G, Args, iterations(FullNs + PureWall + FloorNs, L)}
                end || G <- Groups],
    Items = shuffle([{Index, Kind} || {Index, {_, _, Iters}} <- enumerate(Prepared),
                                      Kind <- [full, pure, floor], _ <- lists:seq(1, Iters)]),
    phase(<<"latency">>, length(Items)),
    ById = maps:from_list(enumerate(Prepared)),
    %% Each sample also notes what ran just before it (for the tails: what a job follows).
    {Samples, _} = lists:foldl(
                fun({Index, Kind} = Key, {Acc, Prev}) ->
                        {{K, _} = G, Args, _} = maps:get(Index, ById),
                        T = case Kind of
                                full -> full(K, Args);
                                pure -> hd(pure(K, Args, 1));
                                floor -> floor_call(Floor, K, Args, floor_out(G))
                            end,
                        step(),
                        Acc1 = maps:update_with(Key, fun(Ts) -> [T | Ts] end, [T], Acc),
                        {maps:update_with({Index, Kind, 'after'}, fun(Ps) -> [Prev | Ps] end,
                                          [Prev], Acc1), Kind}
                end, {#{}, none}, Items),
    lists:foreach(
      fun({Index, {{K, Size} = G, Args, Iters}}) ->
              emit(#{event => result, section => latency, kernel => K, size => Size,
                     elements => elements(G), bytes_in => bytes_in(Args),
                     bytes_out => bytes_out(G), iters => Iters,
                     full_ns => lists:reverse(maps:get({Index, full}, Samples)),
                     pure_ns => lists:reverse(maps:get({Index, pure}, Samples)),
                     floor_ns => lists:reverse(maps:get({Index, floor}, Samples)),
                     'after' => maps:from_list(
                                [{Kind, lists:reverse(maps:get({Index, Kind, 'after'}, Samples))}
                                 || Kind <- [full, pure, floor]])})
      end, enumerate(Prepared)),
    ok.

%% Lone jobs against the lean floor (bench/lean_floor.py), in blocks (erlcuda_lone).

lone(L, #{lean_floor := Script} = Cfg) ->
    phase(<<"lone">>, 1),
    Floor = erlcuda_lone:open(L#{script => Script, python => python_executable(Cfg),
                                 python_dir => python_dir(Cfg)}),
    try
        [emit(E) || E <- erlcuda_lone:run(Floor, L)],
        step(),
        ok
    after
        erlcuda_lone:close(Floor)
    end.

%% Stages: traced jobs, one at a time: the caller's times, and the stages of the stamps.

stages(#{groups := Groups, warmup := Warmup} = S) ->
    Plans = [begin
                 Args = args(G),
                 {G, Args, iterations(2 * warm(fun() -> full(element(1, G), Args) end,
                                                Warmup, 500000000), S)}
             end || G <- Groups],
    phase(<<"stages">>, lists:sum([2 * I || {_, _, I} <- Plans])),
    lists:foreach(fun(P) -> stage_group(P) end, Plans),
    ok.

stage_group({{K, Size} = G, Args, Iters}) ->
    Rows = [begin R = traced(K, Args), step(), R end || _ <- lists:seq(1, Iters)],
    %% The bare transport with the same input bytes, for comparison.
    Payload = fill(rand_block(min(max(bytes_in(Args) div 4, 1), ?BLOCK)), bytes_in(Args)),
    Echo = [begin T = echo(Payload), step(), T end || _ <- lists:seq(1, Iters)],
    Keys = [launch_call, total, decode, queue, group, backend, encode, forward, transit],
    Columns = maps:from_list([{Key, [maps:get(Key, R) || R <- Rows]} || Key <- Keys]),
    emit(#{event => result, section => stages, kernel => K, size => Size,
           elements => elements(G), bytes_in => bytes_in(Args), bytes_out => bytes_out(G),
           iters => Iters, stages => Columns, echo_bytes => byte_size(Payload),
           echo_ns => Echo}).

traced(K, Args) ->
    Opts = [{trace, true} | ?OPTS],
    %% `launch/3' until it returns: checking and encoding the launch and writing it to the
    %% port, one stage (the public API does not split them).
    T0 = now_ns(),
    {ok, JobId} = erlcuda:launch(K, Args, Opts),
    T1 = now_ns(),
    receive
        {erlcuda, JobId, {ok, _}, Trace} ->
            T2 = now_ns(),
            Stages = maps:from_list([{binary_to_atom(S), Ns}
                                     || {S, Ns} <- maps:to_list(
                                                     maps:with([<<"decode">>, <<"queue">>,
                                                                <<"group">>, <<"backend">>,
                                                                <<"encode">>, <<"forward">>],
                                                               Trace))]),
            Total = T2 - T0,
            %% the rest: the port both ways, and the reply's way to this process
            Stages#{launch_call => T1 - T0,
                    total => Total,
                    transit => Total - (T1 - T0) - lists:sum(maps:values(Stages))};
        {erlcuda, JobId, Other, _} ->
            error({launch_failed, K, Other})
    after ?TIMEOUT ->
            error({timeout, K})
    end.

%% Bandwidth: large jobs, and an echo of as many bytes (half each way), alternating; first
%% with the run's env (shared memory where there is some), then at `pipe_sizes' with
%% `shm_dir' none, the application restarted for it and again after.

bandwidth(#{sizes := Sizes} = B, Cfg) ->
    Kernels = maps:get(kernels, B, [vector_add]),
    PipeSizes = maps:get(pipe_sizes, B, []),
    phase(<<"bandwidth">>, length(Kernels) * (length(Sizes) + length(PipeSizes))),
    Shm = shm_active(),
    _ = [begin bandwidth_size(K, N, B, Shm), step() end || N <- Sizes, K <- Kernels],
    case PipeSizes =/= [] andalso Shm of
        true ->
            ok = restart_app(Cfg, #{shm_dir => none}),
            _ = [begin bandwidth_size(K, N, B, shm_active()), step() end
                 || N <- PipeSizes, K <- Kernels],
            restart_app(Cfg, #{});
        false ->
            %% No shared memory in this run: the rows above went through the pipe already.
            _ = [step() || _ <- PipeSizes, _ <- Kernels],
            ok
    end.

bandwidth_size(K, N, B, Shm) ->
    G = {K, N},
    Args = args(G),
    Bytes = bytes_per_job(G, Args),
    %% An echo sends its payload and gets it back: half the job's bytes each way.
    Payload = fill(rand_block(?BLOCK), Bytes div 2),
    FullNs = warm(fun() -> full(K, Args) end, 3, 1000000000),
    EchoNs = warm(fun() -> echo(Payload) end, 3, 1000000000),
    Iters = iterations(FullNs + EchoNs, B),
    Pairs = [{full(K, Args), echo(Payload)} || _ <- lists:seq(1, Iters)],
    Pure = pure(K, Args, min(Iters, 10)),
    %% Through shared memory, the transport's own floor: this process writing the operands
    %% to /dev/shm and reading a result of the job's size back, as erlcuda does, no worker.
    ShmFloor = case Shm of
                   true -> #{shm_floor_ns => [shm_floor(Args, bytes_out(G))
                                              || _ <- lists:seq(1, Iters)]};
                   false -> #{}
               end,
    emit(ShmFloor#{event => result, section => bandwidth, kernel => K, size => N,
                   bytes_per_job => Bytes, bytes_in => bytes_in(Args),
                   bytes_out => bytes_out(G), shm => Shm, shm_threshold => shm_threshold(),
                   echo_bytes => 2 * byte_size(Payload), iters => Iters,
                   full_ns => [F || {F, _} <- Pairs], echo_ns => [E || {_, E} <- Pairs],
                   pure_ns => Pure}).

%% One round of the shared-memory floor: the operands over the threshold written to fresh
%% files, a result of OutBytes (written beforehand, untimed, as the worker would) read back
%% with one pread from a file held open, as a result slot's process reads it; every file
%% deleted, untimed. As erlcuda moves them (erlcuda_shm): operands in parts written at once,
%% the result one file, in a folder like a worker's.
shm_floor(Args, OutBytes) ->
    {ok, Dir} = erlcuda_shm:folder("/dev/shm"),
    {_, Ins} = erlcuda_shm:plan(#{dir => Dir, threshold => shm_threshold()},
                                erlang:unique_integer([positive]), Args),
    Out = [{filename:join(Dir, "r.0"), binary:copy(<<0>>, OutBytes)}
           || OutBytes >= shm_threshold()],
    ok = erlcuda_shm:stage(Out),
    Fds = [begin {ok, Fd} = file:open(F, [read, raw, binary]), Fd end || {F, _} <- Out],
    T0 = now_ns(),
    ok = erlcuda_shm:stage(Ins),
    _ = [{ok, _} = file:pread(Fd, 0, OutBytes) || Fd <- Fds],
    T = now_ns() - T0,
    _ = [file:close(Fd) || Fd <- Fds],
    erlcuda_shm:remove(Dir),
    T.

%% Throughput: N callers, each looping launch_sync until the deadline.

throughput(#{kernels := Kernels, size := Size, callers := Callers,
             batching := Batchings, duration_ms := Ms} = T, #{floor_port := Floor} = Cfg) ->
    Window = maps:get(floor_window, T, 64),
    phase(<<"throughput">>, length(Batchings) * length(Kernels) * length(Callers)
          + length(Kernels)),
    Inputs = [{K, args({K, Size})} || K <- Kernels],
    Final = lists:foldl(
              fun(Batching, Current) ->
                      ok = case Batching =:= Current of
                               true -> ok;
                               false -> restart_app(Cfg, #{batching => Batching})
                           end,
                      [ok = warm_throughput(K, Args) || {K, Args} <- Inputs],
                      [begin
                           R = throughput_run(K, Args, N, Ms),
                           emit(R#{event => result, section => throughput, kernel => K,
                                   size => Size, callers => N, batching => Batching}),
                           step()
                       end || {K, Args} <- Inputs, N <- Callers],
                      Batching
              end, true, Batchings),
    %% The floor, unbatched and pipelined, over the same duration.
    [begin
         Out = floor_out({K, Size}),
         _ = [floor_call(Floor, K, Args, Out) || _ <- lists:seq(1, 20)],
         R = floor_pipelined(Floor, K, Args, Out, Window, Ms),
         emit(R#{event => result, section => floor_throughput, kernel => K, size => Size}),
         step()
     end || {K, Args} <- Inputs],
    case Final of
        true -> ok;
        false -> restart_app(Cfg, #{})
    end.

warm_throughput(K, Args) ->
    _ = [full(K, Args) || _ <- lists:seq(1, 20)],
    ok.

throughput_run(K, Args, N, Ms) ->
    Parent = self(),
    Before = device_counters(),
    Pids = [spawn_link(fun() -> caller(Parent, K, Args) end) || _ <- lists:seq(1, N)],
    [receive {ready, P} -> ok end || P <- Pids],
    Start = now_ns(),
    Deadline = Start + Ms * 1000000,
    _ = [P ! {go, Deadline} || P <- Pids],
    Results = [receive {done, P, C, E, L} -> {C, E, L} end || P <- Pids],
    Elapsed = now_ns() - Start,
    After = device_counters(),
    Jobs = lists:sum([C || {C, _, _} <- Results]),
    Errors = lists:sum([E || {_, E, _} <- Results]),
    Lats = lists:sort(lists:append([L || {_, _, L} <- Results])),
    {J0, L0} = Before,
    {J1, L1} = After,
    #{jobs => Jobs, errors => Errors, elapsed_ns => Elapsed,
      jobs_per_s => Jobs / (Elapsed / 1.0e9),
      jobs_per_launch => case L1 - L0 of 0 -> 0.0; D -> (J1 - J0) / D end,
      latency_ns => #{p50 => percentile(Lats, 0.50), p90 => percentile(Lats, 0.90),
                      p99 => percentile(Lats, 0.99)}}.

caller(Parent, K, Args) ->
    Parent ! {ready, self()},
    receive {go, Deadline} -> caller_loop(Parent, K, Args, Deadline, 0, 0, []) end.

caller_loop(Parent, K, Args, Deadline, Count, Errors, Lats) ->
    T0 = now_ns(),
    case T0 >= Deadline of
        true ->
            Parent ! {done, self(), Count, Errors, Lats};
        false ->
            case erlcuda:launch_sync(K, Args, ?OPTS) of
                {ok, _} ->
                    caller_loop(Parent, K, Args, Deadline, Count + 1, Errors,
                                [now_ns() - T0 | Lats]);
                {error, _} ->
                    caller_loop(Parent, K, Args, Deadline, Count, Errors + 1, Lats)
            end
    end.

device_counters() ->
    case erlcuda:info() of
        #{device_info := [#{jobs := J, launches := L} | _]} -> {J, L};
        _ -> {0, 0}
    end.

%% Hold: does a large result delay a small job on another device? The application is
%% restarted with two devices (the cpu backend's `cpu_devices' 2, unless the worker has two
%% GPUs or more) and, in turn, each `shm_dir' of `shm_modes'. A caller loops small reduce
%% jobs on device 1 (`launch_sync'), alone for `baseline_ms'; then it loops again while this
%% process launches one vector_add of `big_size' elements on device 0 ({format, binary},
%% `launch/3', a timeout of 120 s) and waits for its result, and `tail_ms' after; that
%% `repeats' times. Every small job's start and latency and the big job's times are sent, a
%% window's relative to its big launch, the baseline's to the first. The big job is not
%% traced: a traced job's result never goes through shared memory, so the backend's end is
%% not known here; the report's window is from the big launch to its return.

hold(#{big_size := BigN, small_size := SmallN} = H, Cfg) ->
    Modes = maps:get(shm_modes, H, [auto, none]),
    phase(<<"hold">>, length(Modes)),
    {Backend, Over} = case erlcuda:info() of
                          #{backend := cuda, devices := D} when D >= 2 -> {cuda, #{}};
                          _ -> {cpu, #{backend => cpu, cpu_devices => 2}}
                      end,
    Calls = maps:get(calls, H, [launch]),
    Small = args({reduce, SmallN}),
    Big = args({vector_add, BigN}),
    lists:foreach(
      fun(Mode) ->
              ok = restart_app(Cfg, Over#{shm_dir => Mode}),
              Info = erlcuda:info(),
              lists:foreach(
                fun(Call) ->
                        R = hold_run(Small, Big, Call, H),
                        emit(R#{event => result, section => hold,
                                backend => maps:get(backend, Info),
                                devices => maps:get(devices, Info),
                                forced_cpu => Backend =:= cpu, shm_dir => Mode,
                                shm => shm_active(), shm_threshold => shm_threshold(),
                                small_kernel => reduce, small_size => SmallN,
                                small_device => 1, big_kernel => vector_add,
                                big_size => BigN, big_device => 0, big_call => Call,
                                big_bytes => bytes_in(Big) + bytes_out({vector_add, BigN})})
                end, Calls),
              step()
      end, Modes),
    restart_app(Cfg, #{}).

hold_run(Small, Big, Call, #{baseline_ms := BaseMs} = H) ->
    Lead = maps:get(lead_ms, H, 50),
    Tail = maps:get(tail_ms, H, 100),
    Opts = [{device, 1} | ?OPTS],
    _ = [small_job(Small, Opts) || _ <- lists:seq(1, 50)],
    %% The baseline from a process of its own, as in the windows.
    Baseline = small_loop_for(Small, Opts, fun() -> timer:sleep(BaseMs) end),
    Windows = [hold_window(Small, Big, Call, Opts, Lead, Tail)
               || _ <- lists:seq(1, maps:get(repeats, H, 1))],
    T0 = hd([T || {T, _} <- Windows]),
    #{baseline_start_ns => [T - T0 || {T, _} <- Baseline],
      baseline_ns => [L || {_, L} <- Baseline],
      windows => [W || {_, W} <- Windows]}.

%% One big job with the small loop around it: {its launch time, the window's figures}.
%% For `launch_sync' the launch and the return are one call.
hold_window(Small, Big, Call, Opts, Lead, Tail) ->
    Self = self(),
    During = small_loop_for(
               Small, Opts,
               fun() ->
                       timer:sleep(Lead),
                       T0 = now_ns(),
                       T1 = big_job(Call, Big),
                       T2 = now_ns(),
                       timer:sleep(Tail),
                       Self ! {hold_times, T0, T1, T2}
               end),
    {T0, T1, T2} = receive {hold_times, A, B, C} -> {A, B, C} end,
    {T0, #{start_ns => [T - T0 || {T, _} <- During], latency_ns => [L || {_, L} <- During],
           big_launch_ns => T1 - T0, big_return_ns => T2 - T0}}.

%% The big job's call; the time `launch/3' returned (for `launch_sync', its return).
big_job(launch, Big) ->
    OutBytes = byte_size(hd(Big)),
    {ok, JobId} = erlcuda:launch(vector_add, Big, [{device, 0}, {format, binary},
                                                   {timeout, 120000}]),
    T1 = now_ns(),
    receive
        {erlcuda, JobId, {ok, Bin}} when byte_size(Bin) =:= OutBytes -> T1;
        {erlcuda, JobId, Other} -> error({hold_big_job, Other})
    after 130000 -> error(hold_big_job_timeout)
    end;
big_job(launch_sync, Big) ->
    Elements = byte_size(hd(Big)) div 4,
    case erlcuda:launch_sync(vector_add, Big, [{device, 0}, {timeout, 120000}]) of
        {ok, L} when length(L) =:= Elements -> now_ns();
        Other -> error({hold_big_job, Other})
    end.

small_job(Args, Opts) ->
    T0 = now_ns(),
    case erlcuda:launch_sync(reduce, Args, Opts) of
        {ok, _} -> {T0, now_ns() - T0};
        {error, Why} -> error({hold_small_job, Why})
    end.

%% Small jobs looped in a process of their own while `Fun' runs here: [{Start, Latency}].
small_loop_for(Args, Opts, Fun) ->
    Parent = self(),
    Loop = spawn_link(fun() -> Parent ! {hold_samples, self(), small_loop(Args, Opts, [])}
                      end),
    Fun(),
    Loop ! stop,
    receive {hold_samples, Loop, Samples} -> Samples end.

small_loop(Args, Opts, Acc) ->
    receive
        stop -> lists:reverse(Acc)
    after 0 ->
            small_loop(Args, Opts, [small_job(Args, Opts) | Acc])
    end.

%% erlport beside erlcuda: each repetition runs every measurement, erlport's and erlcuda's
%% interleaved (single calls job by job in a random order, the rest in a random order of
%% the two); the report takes medians over the repetitions. erlport's modules come from the
%% `-pa' that bench/run adds; its Python side imports bench/erlport_peer.py.

erlport(#{reps := Reps} = E0, Cfg) ->
    phase(<<"erlport">>, 4 * Reps),
    E = E0#{python => python_executable(Cfg)},
    P0 = erlport_start(E),
    Tiny = [[1.0]],
    Size = maps:get(vector_size, E, 1000),
    A = vec(Size),
    B = vec(Size),
    Large = maps:get(large_bytes, E) div 8,
    LA = vec(Large),
    LB = vec(Large),
    Budget = maps:get(large_budget_s, E) * 1000000000,
    {_, P, Rows} = lists:foldl(
                     fun(Rep, {Spent, Px, Acc}) ->
                             TinyRow = interleaved(
                                         fun() -> ep_time(Px, noop, [], 8) end,
                                         fun() -> ec_time(reduce, Tiny, [], 8) end,
                                         maps:get(tiny_iters, E)),
                             step(),
                             VecRow = interleaved(
                                        fun() -> ep_time(Px, vector_add, [A, B], 4 * Size) end,
                                        fun() -> ec_time(vector_add, [A, B], ?OPTS, 4 * Size)
                                        end, maps:get(vector_iters, E)),
                             step(),
                             CallersRow = callers_pair(Px, Tiny, E),
                             step(),
                             {Spent1, Px1, LargeRow} = large_pair(Px, LA, LB, E, Spent, Budget),
                             step(),
                             {Spent1, Px1,
                              [#{rep => Rep, tiny => TinyRow, vector_add => VecRow,
                                 callers => CallersRow, large => LargeRow} | Acc]}
                     end, {0, P0, []}, lists:seq(1, Reps)),
    _ = catch python:stop(P),
    Reps1 = lists:reverse(Rows),
    [emit(#{event => result, section => erlport, test => Test,
            size => case Test of
                        vector_add -> Size;
                        large -> Large;
                        _ -> 1
                    end,
            callers => maps:get(callers, E), duration_ms => maps:get(duration_ms, E),
            large_timeout_s => maps:get(large_timeout_s, E),
            reps => [maps:get(Test, R) || R <- Reps1]})
     || Test <- [tiny, vector_add, callers, large]],
    ok.

erlport_start(#{peer_dir := Dir, python := Python}) ->
    {ok, P} = python:start([{python, Python}, {python_path, Dir},
                            {start_timeout, 120000}]),
    _ = python:call(P, erlport_peer, noop, []),
    P.

%% One erlport call, timed; the result's size checked (a binary of `Out' bytes, or none).
ep_time(P, F, Args, Out) ->
    T0 = now_ns(),
    R = python:call(P, erlport_peer, F, Args),
    T = now_ns() - T0,
    ok = check_out(R, Out),
    T.

ec_time(K, Args, Opts, Out) ->
    T0 = now_ns(),
    {ok, R} = erlcuda:launch_sync(K, Args, [{timeout, ?TIMEOUT} | Opts]),
    T = now_ns() - T0,
    ok = check_out(R, Out),
    T.

check_out(R, Out) when is_binary(R), byte_size(R) =:= Out -> ok;
check_out(R, 8) when is_float(R); R =:= undefined -> ok;
check_out(R, Out) -> error({unexpected_result, Out, R}).

%% `Iters' calls of each, job by job in one shuffled order: per side the samples (ns).
interleaved(EpFun, EcFun, Iters) ->
    _ = [{EpFun(), EcFun()} || _ <- lists:seq(1, 5)],  % warm both
    Items = shuffle([K || K <- [erlport, erlcuda], _ <- lists:seq(1, Iters)]),
    Ts = [{K, case K of erlport -> EpFun(); erlcuda -> EcFun() end} || K <- Items],
    #{erlport_ns => [T || {erlport, T} <- Ts], erlcuda_ns => [T || {erlcuda, T} <- Ts]}.

%% N concurrent callers of tiny calls for the duration, each side once, in a random order.
callers_pair(P, Tiny, #{callers := N, duration_ms := Ms}) ->
    Runs = [{Side, concurrent(Fun, N, Ms)}
            || {Side, Fun} <- shuffle([{erlport, fun() -> python:call(P, erlport_peer, noop, [])
                                                 end},
                                       {erlcuda, fun() -> {ok, _} = erlcuda:launch_sync(
                                                                      reduce, Tiny),
                                                          ok end}])],
    maps:from_list(Runs).

concurrent(Fun, N, Ms) ->
    Parent = self(),
    Pids = [spawn_link(fun() ->
                               Parent ! {ready, self()},
                               receive {go, D} -> ok end,
                               Parent ! {done, self(), count_until(Fun, D, 0)}
                       end) || _ <- lists:seq(1, N)],
    [receive {ready, Pid} -> ok end || Pid <- Pids],
    Start = now_ns(),
    _ = [Pid ! {go, Start + Ms * 1000000} || Pid <- Pids],
    Calls = lists:sum([receive {done, Pid, C} -> C end || Pid <- Pids]),
    Elapsed = now_ns() - Start,
    #{calls => Calls, elapsed_ns => Elapsed, calls_per_s => Calls / (Elapsed / 1.0e9)}.

count_until(Fun, Deadline, Count) ->
    case now_ns() >= Deadline of
        true -> Count;
        false -> _ = Fun(), count_until(Fun, Deadline, Count + 1)
    end.

%% The large payload: erlcuda's vector_add of two vectors of half the bytes each, and
%% erlport's call of the same inputs, in a random order. erlport's calls stop once they have
%% used the time budget; one that runs past the timeout counts as that long at least, and
%% its instance (busy with it) is replaced.
large_pair(P, A, B, #{large_timeout_s := TimeoutS} = E, Spent, Budget) ->
    Out = byte_size(A),
    Order = shuffle([erlport, erlcuda]),
    lists:foldl(
      fun(erlcuda, {S, Px, Row}) ->
              {S, Px, Row#{erlcuda_ns => ec_time(vector_add, [A, B], ?OPTS, Out)}};
         (erlport, {S, Px, Row}) when S >= Budget ->
              {S, Px, Row#{erlport_skipped => true}};
         (erlport, {S, Px, Row}) ->
              T0 = now_ns(),
              try python:call(Px, erlport_peer, vector_add, [A, B],
                              [{timeout, TimeoutS * 1000}]) of
                  R ->
                      T = now_ns() - T0,
                      ok = check_out(R, Out),
                      {S + T, Px, Row#{erlport_ns => T}}
              catch
                  error:timeout ->
                      T = now_ns() - T0,
                      _ = catch python:stop(Px),
                      {S + T, erlport_start(E), Row#{erlport_ns => T,
                                                         erlport_timed_out => true}}
              end
      end, {Spent, P, #{bytes => 2 * byte_size(A)}}, Order).

%% Statistics and lists.

median(L) -> percentile(lists:sort(L), 0.5).

percentile([], _) -> 0;
percentile(Sorted, Q) ->
    Rank = max(1, min(length(Sorted), round(Q * length(Sorted) + 0.5))),
    lists:nth(Rank, Sorted).

shuffle(L) ->
    [X || {_, X} <- lists:sort([{rand:uniform(), X} || X <- L])].

enumerate(L) ->
    lists:zip(lists:seq(1, length(L)), L).

%% Progress.

phase(Name, Total) ->
    put(bench_progress, {Total, 0, now_ns()}),
    emit(#{event => phase, name => Name, total => Total}).

step() ->
    {Total, Done0, Last} = get(bench_progress),
    Done = Done0 + 1,
    Now = now_ns(),
    case Done >= Total orelse Now - Last >= 100000000 of
        true ->
            emit(#{event => progress, done => Done, total => Total}),
            put(bench_progress, {Total, Done, Now});
        false ->
            put(bench_progress, {Total, Done, Last})
    end,
    ok.

%% A small JSON encoder: maps, lists, tuples (as arrays), numbers, binaries and atoms.

emit(Term) ->
    ok = io:put_chars(standard_io, [json(Term), $\n]).

fmt(Format, Args) ->
    unicode:characters_to_binary(io_lib:format(Format, Args)).

-spec json(term()) -> iodata().
json(true) -> <<"true">>;
json(false) -> <<"false">>;
json(null) -> <<"null">>;
json(undefined) -> <<"null">>;
json(A) when is_atom(A) -> json(atom_to_binary(A, utf8));
json(I) when is_integer(I) -> integer_to_binary(I);
json(F) when is_float(F) -> float_to_binary(F, [short]);
json(B) when is_binary(B) -> [$", escape(B), $"];
json(M) when is_map(M) ->
    [${, join([[json(key(K)), $:, json(V)] || {K, V} <- lists:sort(maps:to_list(M))]), $}];
json(L) when is_list(L) -> [$[, join([json(X) || X <- L]), $]];
json(T) when is_tuple(T) -> json(tuple_to_list(T));
json(Other) -> json(fmt("~0p", [Other])).

key(K) when is_atom(K); is_binary(K) -> K;
key(K) -> fmt("~0p", [K]).

join([]) -> [];
join([H | T]) -> [H | [[$,, X] || X <- T]].

escape(B) ->
    Chars = case unicode:characters_to_list(B) of
                L when is_list(L) -> L;
                _ -> binary_to_list(B)
            end,
    [esc(C) || C <- Chars].

esc($") -> <<"\\\"">>;
esc($\\) -> <<"\\\\">>;
esc($\n) -> <<"\\n">>;
esc(C) when C < 32; C > 126 ->
    io_lib:format("\\u~4.16.0b", [min(C, 16#FFFD)]);
esc(C) -> C.
