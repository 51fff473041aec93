%% The Erlang side of a job's trip through shared memory, without the worker: two operands
%% written and a result read, by the slots' part processes as erlcuda does it
%% (erlcuda_shm_slots: a message to each part's process, its `pwrite' and its check that the
%% file still has a name, the answer) against one process that holds the files open itself
%% (two `pwrite's and a `pread') and against the lean floor's single file (one `pwrite' of
%% both operands, one `pread'). Each way is timed after the node has been idle for a
%% millisecond (`idle': schedulers asleep, and a part's last check that its file is still
%% named too old to count), after a round trip through a port (`port': as a lone caller's
%% jobs follow each other, the worker's answer between them) and back to back (`busy').
%%
%%   erlc -o /tmp bench/erlcuda_hops.erl
%%   erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp \
%%       -eval 'erlcuda_hops:main(), halt().'
%%
%% Prints per size (1e3, 1e4, 1e5 f32 elements an operand) the p50 and p90 in µs of each
%% way. Not part of the application.
-module(erlcuda_hops).
-export([main/0]).

-define(RUNS, 400).

main() ->
    Dir = "/dev/shm/erlcuda-hops-" ++ os:getpid(),
    ok = file:make_dir(Dir),
    ok = erlcuda_shm_slots:create(),
    Folder = #{dir => Dir, keeper => erlcuda_shm_slots:keeper(), threshold => 1},
    try
        io:format("# bench/erlcuda_hops.erl: us, p50 / p90 of ~b; idle: after 1 ms idle, "
                  "port: after a round trip through a port, busy: back to back~n", [?RUNS]),
        io:format("~8s ~5s ~22s ~22s ~22s ~22s~n",
                  ["elements", "gap", "parts' processes", "one process, 3 files",
                   "floor: 1 file", "parts', no name check"]),
        Port = open_port({spawn, "cat"}, [binary]),
        [sizes(Folder, N, Gap, Port) || N <- [1000, 10000, 100000], Gap <- [idle, port, busy]]
    after
        os:cmd("rm -rf " ++ Dir)
    end,
    ok.

sizes(#{dir := Dir} = Folder, N, Gap, Port) ->
    Bytes = 4 * N,
    A = crypto:strong_rand_bytes(Bytes),
    B = crypto:strong_rand_bytes(Bytes),
    PartBytes = erlcuda_shm:part_bytes(Bytes),
    {ok, SA} = erlcuda_shm_slots:claim(Folder, PartBytes, 1),
    {ok, SB} = erlcuda_shm_slots:claim(Folder, PartBytes, 1),
    {ok, SR} = erlcuda_shm_slots:claim(Folder, PartBytes, 1),
    ok = erlcuda_shm_slots:reserve(SR),
    Parts = fun() ->
                    ok = erlcuda_shm_slots:written(
                           erlcuda_shm_slots:send_writes(SA, [A])
                           ++ erlcuda_shm_slots:send_writes(SB, [B])),
                    {ok, _} = erlcuda_shm_slots:read(SR, Bytes)
            end,
    Fds = [open(Dir, "h" ++ integer_to_list(I) ++ "-" ++ integer_to_list(N), PartBytes)
           || I <- [1, 2, 3]],
    [FA, FB, FR] = Fds,
    Held = fun() ->
                   ok = file:pwrite(FA, 0, A),
                   ok = file:pwrite(FB, 0, B),
                   {ok, _} = file:pread(FR, 0, Bytes)
           end,
    F1 = open(Dir, "floor-" ++ integer_to_list(N), 3 * PartBytes),
    Floor = fun() ->
                    ok = file:pwrite(F1, 0, [A, B]),
                    {ok, _} = file:pread(F1, 2 * Bytes, Bytes)
            end,
    Pids = [spawn_link(fun() -> part(open(Dir, P ++ "-" ++ integer_to_list(N), PartBytes))
                       end) || P <- ["n1", "n2", "n3"]],
    NoCheck = fun() -> no_check(Pids, A, B, Bytes) end,
    Ways = [Parts, Held, Floor, NoCheck],
    %% the ways in turn, a block of each, twice: a slow spell hits them all
    Times = [[timed(W, {Gap, Port}, ?RUNS div 2) || W <- Ways] || _ <- [1, 2]],
    Merged = [lists:append(T) || T <- transpose(Times)],
    io:format("~8b ~5s~s~n", [N, Gap, [io_lib:format(" ~22s", [pcts(T)]) || T <- Merged]]),
    _ = [file:close(Fd) || Fd <- [F1 | Fds]],
    _ = [begin unlink(P), exit(P, kill) end || P <- Pids],
    _ = [erlcuda_shm_slots:discard(S) || S <- [SA, SB, SR]],
    ok.

transpose([[] | _]) -> [];
transpose(Rows) -> [[hd(R) || R <- Rows] | transpose([tl(R) || R <- Rows])].

open(Dir, Name, Size) ->
    {ok, Fd} = file:open(filename:join(Dir, Name), [raw, read, write, binary]),
    ok = file:allocate(Fd, 0, Size),
    Fd.

%% A part's process as erlcuda_shm_slots has it, less the check that its file still has a
%% name (`read_file_info' after each write).
part(Fd) ->
    receive
        {{write, Bin}, From, Ref} -> From ! {Ref, file:pwrite(Fd, 0, Bin)};
        {{read, Bytes}, From, Ref} -> From ! {Ref, file:pread(Fd, 0, Bytes)}
    end,
    part(Fd).

no_check([P1, P2, P3], A, B, Bytes) ->
    R1 = ask(P1, {write, A}),
    R2 = ask(P2, {write, B}),
    ok = answer(R1),
    ok = answer(R2),
    {ok, _} = answer(ask(P3, {read, Bytes})).

ask(Pid, Request) ->
    Ref = make_ref(),
    Pid ! {Request, self(), Ref},
    Ref.

answer(Ref) ->
    receive {Ref, Result} -> Result end.

timed(Fun, Gap, Runs) ->
    _ = [Fun() || _ <- lists:seq(1, 20)],
    [begin
         idle(Gap),
         T0 = erlang:monotonic_time(nanosecond),
         _ = Fun(),
         (erlang:monotonic_time(nanosecond) - T0) / 1000
     end || _ <- lists:seq(1, Runs)].

idle({idle, _}) ->
    receive after 1 -> ok end;
idle({port, Port}) ->
    Port ! {self(), {command, <<"x">>}},
    receive {Port, {data, _}} -> ok end;
idle({busy, _}) ->
    ok.

pcts(Ts) ->
    S = lists:sort(Ts),
    At = fun(P) -> lists:nth(max(1, round(P * length(S))), S) end,
    io_lib:format("~.1f / ~.1f", [At(0.5), At(0.9)]).
