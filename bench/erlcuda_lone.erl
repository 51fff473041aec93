%% Lone small jobs against the lean floor (bench/lean_floor.py), for `bench/run' (its `lone'
%% section) and `bench/bus'.
%%
%% The lean floor is a port this process owns: `{packet, 4}', one Python thread that copies
%% a job's operands into pinned memory allocated once, runs the copies and the kernel on one
%% stream, and answers the raw result. erlcuda runs the same job through its public API:
%% `launch_sync' of vector_add on two binaries (`{format, binary}'), on two lists (floats
%% back), and reduce of a binary. Each kind runs `block' jobs in a row (every job timed on
%% its own, wall time in this process), and the kinds take turns: the lean floor before each
%% of erlcuda's, `rounds' times, after one round not timed. A job thus follows a job of its
%% own kind, as a lone job of a busy caller does, and both sides are measured under the same
%% conditions of the machine, minutes apart at most. One more kind, `binary_spin', is the
%% binaries' job with `caller_spin_us' set to ?SPIN_US for its blocks (the caller polls its
%% mailbox that long before it sleeps), to see whether that pays on this machine.
-module(erlcuda_lone).

-export([open/1, close/1, run/2, call/2]).

-define(TIMEOUT, 60000).
%% The kinds in the order each round runs them, and which floor each is compared with.
-define(ORDER, [floor_add, binary, floor_add, binary_spin, floor_add, lists, floor_reduce,
                reduce]).
-define(SPIN_US, 200).

-type floor() :: #{port := port(), backend := binary(), device := binary()}.

%% @doc Start the lean floor (`script', under `python', with erlcuda's Python package at
%% `python_dir' on its path) on the backend erlcuda runs; with `shm', it makes that file
%% and serves its shared-memory job from it too.
-spec open(map()) -> floor().
open(#{script := Script, python := Python, python_dir := Dir, size := Size} = Opts) ->
    Backend = atom_to_list(maps:get(backend, erlcuda:info())),
    Path = string:join([Dir | [P || P <- [os:getenv("PYTHONPATH", "")], P =/= ""]], ":"),
    Shm = case Opts of
              #{shm := File} -> ["--shm", File];
              #{} -> []
          end,
    Port = open_port({spawn_executable, Python},
                     [{args, [Script, "--backend", Backend,
                              "--max-elements", integer_to_list(Size) | Shm]},
                      {packet, 4}, binary, nouse_stdio, exit_status, {env, [{"PYTHONPATH", Path}]}]),
    Hello = receive
                {Port, {data, H}} -> maps:from_list([list_to_tuple(binary:split(L, <<"=">>))
                                                     || L <- binary:split(H, <<"\n">>, [global]),
                                                        L =/= <<>>]);
                {Port, {exit_status, S}} -> error({lean_floor_exited, S})
            after 120000 -> error(lean_floor_no_hello)
            end,
    #{port => Port, backend => maps:get(<<"backend">>, Hello),
      device => maps:get(<<"device">>, Hello, <<"?">>)}.

-spec close(floor()) -> ok.
close(#{port := Port}) ->
    port_close(Port),
    ok.

%% @doc The rounds (see the module doc): one event per kind with every sample, in ns.
-spec run(floor(), map()) -> [map()].
run(Floor, #{size := Size, block := Block, rounds := Rounds}) ->
    A = floats(Size, 1), B = floats(Size, 2),
    Jobs = jobs(Floor, A, B),
    ok = check(Jobs, A, B),
    _ = [block(K, Jobs, Block) || K <- ?ORDER],  % one round, not timed
    Samples = lists:foldl(
                fun(_, Acc) ->
                        lists:foldl(fun(K, In) ->
                                            Ts = block(K, Jobs, Block),
                                            maps:update_with(K, fun(Old) -> Ts ++ Old end,
                                                             Ts, In)
                                    end, Acc, ?ORDER)
                end, #{}, lists:seq(1, Rounds)),
    [#{event => result, section => lone, kind => K, size => Size, block => Block,
       samples_ns => maps:get(K, Samples), floor => floor_of(K)}
     || K <- lists:usort(?ORDER)].

floor_of(binary) -> floor_add;
floor_of(binary_spin) -> floor_add;
floor_of(lists) -> floor_add;
floor_of(reduce) -> floor_reduce;
floor_of(_) -> none.

%% Each kind's call: it returns its result.
jobs(#{port := Port}, A, B) ->
    LA = [F || <<F:32/float-little>> <= A], LB = [F || <<F:32/float-little>> <= B],
    N = byte_size(A) div 4,
    Opts = [{format, binary}, {timeout, ?TIMEOUT}],
    #{floor_add => fun() -> call(Port, [<<0, N:32/little>>, A, B]) end,
      floor_reduce => fun() -> call(Port, [<<1, N:32/little>>, A]) end,
      binary => fun() -> {ok, R} = erlcuda:launch_sync(vector_add, [A, B], Opts), R end,
      binary_spin => fun() -> {ok, R} = erlcuda:launch_sync(vector_add, [A, B], Opts), R end,
      lists => fun() -> {ok, R} = erlcuda:launch_sync(vector_add, [LA, LB],
                                                      [{timeout, ?TIMEOUT}]), R end,
      reduce => fun() -> {ok, R} = erlcuda:launch_sync(reduce, [A], Opts), R end}.

%% @doc One request to the lean floor: its answer.
-spec call(port(), iodata()) -> binary().
call(Port, Frame) ->
    true = port_command(Port, Frame),
    receive
        {Port, {data, Result}} -> Result;
        {Port, {exit_status, S}} -> error({lean_floor_exited, S})
    after ?TIMEOUT -> error(lean_floor_timeout)
    end.

%% Both sides give the same answers before anything is timed.
check(#{floor_add := FloorAdd, floor_reduce := FloorReduce, binary := Bin, lists := List,
        reduce := Reduce}, A, B) ->
    Pairs = lists:zip([X || <<X:32/float-little>> <= A], [Y || <<Y:32/float-little>> <= B]),
    Sum = << <<(X + Y):32/float-little>> || {X, Y} <- Pairs >>,
    Sum = FloorAdd(),
    Sum = Bin(),
    true = List() =:= [F || <<F:32/float-little>> <= Sum],
    <<Total:64/float-little>> = FloorReduce(),
    true = Total == Reduce(),
    ok.

%% A block of one kind: the caller spinning for `binary_spin' alone.
block(binary_spin, Jobs, Block) ->
    Setting = application:get_env(erlcuda, caller_spin_us, auto),
    ok = application:set_env(erlcuda, caller_spin_us, ?SPIN_US),
    try timed(maps:get(binary_spin, Jobs), Block)
    after ok = application:set_env(erlcuda, caller_spin_us, Setting)
    end;
block(Kind, Jobs, Block) ->
    timed(maps:get(Kind, Jobs), Block).

timed(Fun, Block) ->
    [begin
         T0 = erlang:monotonic_time(nanosecond),
         _ = Fun(),
         erlang:monotonic_time(nanosecond) - T0
     end || _ <- lists:seq(1, Block)].

%% Small integers: every sum is exact in f32, on any backend.
floats(N, Seed) ->
    << <<(float((I * Seed) rem 97)):32/float-little>> || I <- lists:seq(0, N - 1) >>.
