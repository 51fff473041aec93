%% The benchmark node of `bench/run': one long-lived Erlang node with the worker attached.
%%
%% `main(ConfigFile)' reads one map (written by bench/run with `file:consult/1' syntax),
%% starts erlcuda with the application env it names (with `bench_hooks' true, for the
%% worker's `pure' and `echo' calls, and `python', the interpreter bench/run itself runs
%% under), runs the sections and writes one JSON object a line on stdout:
%% `{"event":"phase",...}', `{"event":"progress","done":N,"total":M}',
%% `{"event":"result","section":...}', `{"event":"info",...}', and at the end
%% `{"event":"done"}' (or `{"event":"error",...}'). Logs go to stderr, so stdout carries
%% nothing else. Times are `erlang:monotonic_time(nanosecond)'; the worker's stamps are its
%% own `perf_counter_ns' and only their differences are used.
%%
%% Sections:
%%   latency     per kernel and size, the full stack (`erlcuda:launch_sync/3') and the pure
%%               backend call timed in the worker (`erlcuda_worker:call(pure, ...)'), job by
%%               job, both kinds and all sizes shuffled into one random order;
%%   stages      traced jobs (`{trace, true}'): where one job's time goes, plus an echo of
%%               the same input bytes as the bare transport;
%%   bandwidth   large vector_add jobs beside an echo moving the same bytes;
%%   throughput  N concurrent callers looping `launch_sync' until a deadline, batching on
%%               and off (the application is restarted with `batching' false).
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
    {ok, [Cfg]} = file:consult(ConfigFile),
    _ = rand:seed(exsss, maps:get(seed, Cfg, 1)),
    ok = start_app(Cfg, true),
    emit(info_event(Cfg)),
    Sections = maps:get(sections, Cfg, [latency, stages, bandwidth, throughput]),
    [ok = section(S, Cfg) || S <- Sections],
    ok.

section(latency, #{latency := L}) -> latency(L);
section(stages, #{stages := S}) -> stages(S);
section(bandwidth, #{bandwidth := B}) -> bandwidth(B);
section(throughput, #{throughput := T} = Cfg) -> throughput(T, Cfg);
section(_, _) -> ok.

%% The application.

start_app(Cfg, Batching) ->
    _ = application:load(erlcuda),
    %% bench_hooks: the worker answers the benchmark calls (pure, echo) only with it.
    Env = [{backend, maps:get(backend, Cfg, auto)},
           {cpu_devices, 1},
           {max_queue, maps:get(max_queue, Cfg, 100000)},
           {batching, Batching},
           {bench_hooks, true}
           | [{python, P} || P <- [maps:get(python, Cfg, default)], is_list(P)]],
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    {ok, _} = application:ensure_all_started(erlcuda),
    case erlcuda:info() of
        #{worker_status := up, status := ok} -> ok;
        Info -> error({erlcuda_not_ready, maps:with([worker_status, status, reason], Info)})
    end.

restart_app(Cfg, Batching) ->
    ok = application:stop(erlcuda),
    start_app(Cfg, Batching).

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
      worker_python_version => maps:get(python, Info, <<>>),
      worker_python => unicode:characters_to_binary(Python),
      otp_release => list_to_binary(erlang:system_info(otp_release)),
      otp_version => otp_version(),
      erts_version => list_to_binary(erlang:system_info(version)),
      schedulers => erlang:system_info(schedulers_online)}.

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

%% Latency: the full stack against the pure backend path, job by job in random order.

latency(#{groups := Groups, warmup := Warmup} = L) ->
    phase(<<"warm-up">>, length(Groups)),
    Prepared = [begin
                    Args = args(G),
                    {K, _} = G,
                    FullNs = warm(fun() -> full(K, Args) end, Warmup, 1000000000),
                    %% The backend's own warm-up (caches, allocations), about a second at most.
                    _ = pure(K, Args, max(1, min(Warmup, 1000000000 div max(FullNs, 1)))),
                    PureWall = warm(fun() -> T0 = now_ns(), _ = pure(K, Args, 1),
                                             now_ns() - T0 end, Warmup, 1000000000),
                    step(),
                    {G, Args, iterations(FullNs + PureWall, L)}
                end || G <- Groups],
    Items = shuffle([{Index, Kind} || {Index, {_, _, Iters}} <- enumerate(Prepared),
                                      Kind <- [full, pure], _ <- lists:seq(1, Iters)]),
    phase(<<"latency">>, length(Items)),
    ById = maps:from_list(enumerate(Prepared)),
    Samples = lists:foldl(
                fun({Index, Kind} = Key, Acc) ->
                        {{K, _}, Args, _} = maps:get(Index, ById),
                        T = case Kind of
                                full -> full(K, Args);
                                pure -> hd(pure(K, Args, 1))
                            end,
                        step(),
                        maps:update_with(Key, fun(Ts) -> [T | Ts] end, [T], Acc)
                end, #{}, Items),
    lists:foreach(
      fun({Index, {{K, Size} = G, Args, Iters}}) ->
              emit(#{event => result, section => latency, kernel => K, size => Size,
                     elements => elements(G), bytes_in => bytes_in(Args),
                     bytes_out => bytes_out(G), iters => Iters,
                     full_ns => lists:reverse(maps:get({Index, full}, Samples)),
                     pure_ns => lists:reverse(maps:get({Index, pure}, Samples))})
      end, enumerate(Prepared)),
    ok.

%% Stages: traced jobs, one at a time; the Erlang stamps and the worker's, each on its clock.

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
    Offset = clock_offset(),
    Rows = [begin R = traced(K, Args, Offset), step(), R end || _ <- lists:seq(1, Iters)],
    %% The bare transport with the same input bytes, for comparison.
    Payload = fill(rand_block(min(max(bytes_in(Args) div 4, 1), ?BLOCK)), bytes_in(Args)),
    Echo = [begin T = echo(Payload), step(), T end || _ <- lists:seq(1, Iters)],
    Keys = [erlang_encode, launch_call, total, deliver, decode, queue, group, backend,
            encode, transit, request_hop, reply_hop],
    Columns = maps:from_list([{Key, [maps:get(Key, R) || R <- Rows]} || Key <- Keys]),
    emit(#{event => result, section => stages, kernel => K, size => Size,
           elements => elements(G), bytes_in => bytes_in(Args), bytes_out => bytes_out(G),
           iters => Iters, stages => Columns, echo_bytes => byte_size(Payload),
           echo_ns => Echo, clock => clock_source()}).

%% Erlang's monotonic clock is the OS's CLOCK_MONOTONIC plus an offset; so is the worker's
%% perf_counter on Linux. With the offset the two hops over the port can be timed apart.
clock_source() ->
    Source = erlang:system_info(os_monotonic_time_source),
    atom_to_binary(proplists:get_value(clock_id, Source, unknown), utf8).

clock_offset() ->
    Samples = [begin
                   A = now_ns(),
                   Os = proplists:get_value(time, erlang:system_info(os_monotonic_time_source)),
                   B = now_ns(),
                   {B - A, (A + B) div 2 - erlang:convert_time_unit(Os, native, nanosecond)}
               end || _ <- lists:seq(1, 20)],
    {_, Offset} = lists:min(Samples),
    Offset.

traced(K, Args, Offset) ->
    Opts = [{trace, true} | ?OPTS],
    %% Checking and encoding the launch, timed alone (launch/3 does the same, then writes).
    E0 = now_ns(),
    {ok, Job} = erlcuda_job:validate(K, Args, Opts),
    {ok, Frame} = erlcuda_protocol:encode_launch(1, self(), 0, K, maps:get(args, Job),
                                                 #{format => binary, trace => true}),
    E1 = now_ns(),
    _ = iolist_size(Frame),
    T0 = now_ns(),
    {ok, JobId} = erlcuda:launch(K, Args, Opts),
    T1 = now_ns(),
    receive
        {erlcuda, JobId, {ok, _}, Trace} ->
            T2 = now_ns(),
            #{<<"recv">> := Recv, <<"queued">> := Queued, <<"take">> := Take,
              <<"run">> := Run, <<"done">> := Done, <<"encode">> := Encode,
              <<"forward">> := Forward} = Trace,
            Total = T2 - T0,
            Deliver = T2 - Forward,
            #{erlang_encode => E1 - E0,
              launch_call => T1 - T0,
              total => Total,
              deliver => Deliver,
              decode => Queued - Recv,
              queue => Take - Queued,
              group => Run - Take,
              backend => Done - Run,
              encode => Encode - Done,
              transit => Total - (T1 - T0) - Deliver - (Encode - Recv),
              request_hop => Recv - (T1 - Offset),
              reply_hop => (Forward - Offset) - Encode};
        {erlcuda, JobId, Other, _} ->
            error({launch_failed, K, Other})
    after ?TIMEOUT ->
            error({timeout, K})
    end.

%% Bandwidth: large vector_add jobs, and an echo of as many bytes in and out, alternating.

bandwidth(#{sizes := Sizes} = B) ->
    phase(<<"bandwidth">>, length(Sizes)),
    lists:foreach(fun(N) -> bandwidth_size(N, B), step() end, Sizes),
    ok.

bandwidth_size(N, B) ->
    Args = args({vector_add, N}),
    Bytes = bytes_in(Args) + bytes_out({vector_add, N}),
    %% An echo sends its payload and gets it back: half the job's bytes each way.
    Payload = fill(rand_block(?BLOCK), Bytes div 2),
    FullNs = warm(fun() -> full(vector_add, Args) end, 3, 1000000000),
    EchoNs = warm(fun() -> echo(Payload) end, 3, 1000000000),
    Iters = iterations(FullNs + EchoNs, B),
    Pairs = [{full(vector_add, Args), echo(Payload)} || _ <- lists:seq(1, Iters)],
    Pure = pure(vector_add, Args, min(Iters, 10)),
    emit(#{event => result, section => bandwidth, kernel => vector_add, size => N,
           bytes_per_job => Bytes, echo_bytes => 2 * byte_size(Payload), iters => Iters,
           full_ns => [F || {F, _} <- Pairs], echo_ns => [E || {_, E} <- Pairs],
           pure_ns => Pure}).

%% Throughput: N callers, each looping launch_sync until the deadline.

throughput(#{kernels := Kernels, size := Size, callers := Callers,
             batching := Batchings, duration_ms := Ms}, Cfg) ->
    phase(<<"throughput">>, length(Batchings) * length(Kernels) * length(Callers)),
    Inputs = [{K, args({K, Size})} || K <- Kernels],
    Final = lists:foldl(
              fun(Batching, Current) ->
                      ok = case Batching =:= Current of
                               true -> ok;
                               false -> restart_app(Cfg, Batching)
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
    case Final of
        true -> ok;
        false -> restart_app(Cfg, true)
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
