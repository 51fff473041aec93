%% Operand slots (erlcuda_shm_slots) without a worker: a slot is taken by one job at a time,
%% given back or deleted once (whichever comes first), written again by the next job that
%% takes it, kept within the pool's bytes, and deleted when idle, when the process that took
%% it died before its job held it, and with its worker's keeper.
-module(erlcuda_shm_slots_tests).

-include_lib("eunit/include/eunit.hrl").
-include("erlcuda_contract.hrl").

-define(MIB, 1048576).

%% A folder and a keeper of its own, the tables made afresh, for each test.
slots_test_() ->
    {foreach,
     fun() ->
             _ = application:stop(erlcuda),
             Dir = filename:join("/tmp", "erlcuda-slots-tests-" ++ os:getpid()),
             _ = file:del_dir_r(Dir),
             ok = file:make_dir(Dir),
             Owner = spawn(fun() -> ok = erlcuda_shm_slots:create(), receive stop -> ok end end),
             ok = erlcuda_test_util:wait_until(
                    fun() -> ets:info(erlcuda_shm_free) =/= undefined end, 50),
             Keeper = erlcuda_shm_slots:keeper(),
             unlink(Keeper),  % its death must not take the test along
             {#{dir => Dir, threshold => 1, keeper => Keeper}, Owner}
     end,
     fun({#{dir := Dir, keeper := Keeper}, Owner}) ->
             exit(Keeper, kill),
             Owner ! stop,
             _ = file:del_dir_r(Dir)
     end,
     [fun(Setup) -> {Name, fun() -> Test(element(1, Setup)) end} end
      || {Name, Test} <- [{"taken once, written again", fun written_again/1},
                          {"given back or deleted once", fun once/1},
                          {"grown by larger operands", fun grown/1},
                          {"within the pool's bytes", fun bounded/1},
                          {"swept when idle or orphaned", fun swept/1},
                          {"gone with the keeper", fun keeper_gone/1},
                          {"a result answered before the keeper died is still read",
                           fun result_read_past_keeper/1},
                          {"refused once its file is deleted", fun deleted/1},
                          {"writes right after a check are not checked again",
                           fun unchecked_writes/1},
                          {"unchecked writes do not renew the check",
                           fun unchecked_writes_do_not_renew/1},
                          {"a write once the check is old finds the file gone",
                           fun deleted_between_writes/1},
                          {"a result read from its slot", fun result_read/1},
                          {"a result read and sent by its part", fun result_read_then/1},
                          {"a result of a deleted slot is answered",
                           fun result_read_then_deleted/1},
                          {"a free slot that cannot grow is uncounted", fun not_grown/1},
                          {"a result past the pool's room", fun over/1}]]}.

%% An operand's parts written into a slot, as erlcuda_shm:stage/1 writes them.
write(Slot, Bins) ->
    erlcuda_shm_slots:written(erlcuda_shm_slots:send_writes(Slot, Bins)).

part(#{dir := Dir}, #{name := Name}, K) ->
    filename:join(Dir, binary_to_list(Name) ++ "." ++ integer_to_list(K)).

written_again(Folder) ->
    #{made := Made} = erlcuda_shm_slots:stats(),  % node-wide: the names are never reused
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 2),
    ?assertEqual(ok, write(Slot, [<<1, 2, 3>>, <<4>>])),
    {ok, Part0} = file:read_file(part(Folder, Slot, 0)),
    ?assertEqual(?MIB, byte_size(Part0)),  % a part's size: the worker maps it whole
    ?assertEqual(<<1, 2, 3>>, binary:part(Part0, 0, 3)),
    ?assertMatch(#{claimed := 1, free := 0}, erlcuda_shm_slots:stats()),
    %% taken by one job at a time: another job gets another slot
    {ok, Other} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ?assertNotEqual(maps:get(name, Slot), maps:get(name, Other)),
    ok = erlcuda_shm_slots:release(Slot),
    {ok, Again} = erlcuda_shm_slots:claim(Folder, ?MIB, 2),
    ?assertEqual(maps:get(name, Slot), maps:get(name, Again)),
    ?assertEqual(ok, write(Again, [<<9>>])),
    {ok, <<9, 2, 3, _/binary>>} = file:read_file(part(Folder, Slot, 0)),
    ?assertEqual(Made + 2, maps:get(made, erlcuda_shm_slots:stats())).

%% A part's file deleted under it (its folder removed) fails the write that finds it gone
%% (the job's data then takes the pipe: the worker could not map it) and every later one. A
%% write long after the part's last check finds it before answering.
deleted(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ?assertEqual(ok, write(Slot, [<<1>>])),
    ok = file:delete(part(Folder, Slot, 0)),
    timer:sleep(20),
    {error, {Got, deleted}} = write(Slot, [<<2>>]),
    ?assertEqual(part(Folder, Slot, 0), unicode:characters_to_list(Got)),
    ?assertMatch({error, {_, deleted}}, write(Slot, [<<3>>])).

%% A write that follows the part's last check closely is answered (the worker maps the file
%% already, and its mapping shares the pages), its bytes in the file's pages; a write once
%% the check has grown old finds the file gone, and every later one. (On a slow machine the
%% second write may come late enough to be checked.)
deleted_between_writes(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ?assertEqual(ok, write(Slot, [<<1>>])),
    {ok, Fd} = file:open(part(Folder, Slot, 0), [raw, read, binary]),
    ok = file:delete(part(Folder, Slot, 0)),
    Second = write(Slot, [<<2>>]),
    %% an answered write is in the file's pages, which a mapping made before still reads
    ?assertEqual({ok, <<2>>}, file:pread(Fd, 0, 1)),
    ok = file:close(Fd),
    timer:sleep(20),
    ?assertMatch({error, {_, deleted}}, write(Slot, [<<3>>])),
    ?assertMatch({error, {_, deleted}}, write(Slot, [<<4>>])),
    %% answered unchecked, or checked where this machine took over 5 ms for it
    ?assert(case Second of ok -> true; {error, {_, deleted}} -> true; _ -> false end).

%% Writes that follow the part's last check closely are not checked again: a file deleted
%% after that check is still written (into the pages the worker's mapping shares) until the
%% check grows old. Asserted on the first of up to 20 tries (each on a slot of its own) whose
%% three writes all came within 4 ms (the check holds for 5 to 6: erlcuda_shm_slots'
%% NAMED_MS); a machine too loaded for any such try asserts nothing here.
unchecked_writes(Folder) ->
    unchecked_writes(Folder, 20).

unchecked_writes(_, 0) ->
    ok;
unchecked_writes(Folder, Tries) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    T0 = erlang:monotonic_time(microsecond),
    ?assertEqual(ok, write(Slot, [<<1>>])),
    ok = file:delete(part(Folder, Slot, 0)),
    Second = write(Slot, [<<2>>]),
    Third = write(Slot, [<<3>>]),
    case erlang:monotonic_time(microsecond) - T0 < 4000 of
        true -> ?assertEqual({ok, ok}, {Second, Third});
        false -> unchecked_writes(Folder, Tries - 1)
    end.

%% The writes answered unchecked do not renew the check: with a write every millisecond
%% after the deletion, one of the first hundred finds the file gone.
unchecked_writes_do_not_renew(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ?assertEqual(ok, write(Slot, [<<1>>])),
    ok = file:delete(part(Folder, Slot, 0)),
    Found = fun Next(0) -> not_found;
                Next(N) ->
                    case write(Slot, [<<2>>]) of
                        ok -> timer:sleep(1), Next(N - 1);
                        {error, {_, deleted}} -> found
                    end
            end,
    ?assertEqual(found, Found(100)).

%% A free slot taken for an operand of more parts than the pool has room for is deleted,
%% and its bytes leave the pool's count with it.
not_grown(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, 256 * ?MIB, 1),
    ok = erlcuda_shm_slots:release(Slot),
    ?assertMatch(#{bytes := Bytes} when Bytes =:= 256 * ?MIB, erlcuda_shm_slots:stats()),
    ?assertEqual(none, erlcuda_shm_slots:claim(Folder, 256 * ?MIB, 8)),  % 2 GiB: no room
    ?assertMatch(#{bytes := 0, free := 0, claimed := 0}, erlcuda_shm_slots:stats()).

%% A result finds a slot past the pool's bytes (a slot of its own, counted), and it is
%% deleted when given back while the pool is over them; within them, a slot goes back free.
over(Folder) ->
    {ok, Full} = erlcuda_shm_slots:claim(Folder, 512 * ?MIB, 2),
    ?assertEqual(none, erlcuda_shm_slots:claim(Folder, 512 * ?MIB, 1)),
    {ok, Over} = erlcuda_shm_slots:claim_over(Folder, 512 * ?MIB),
    ?assertMatch(#{bytes := B, claimed := 2} when B =:= 1536 * ?MIB, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> filelib:is_file(part(Folder, Over, 0)) end, 50)),
    ok = erlcuda_shm_slots:release(Over),
    ?assertMatch(#{bytes := B, claimed := 1, free := 0} when B =:= 1024 * ?MIB,
                 erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> not filelib:is_file(part(Folder, Over, 0)) end, 50)),
    ok = erlcuda_shm_slots:release(Full),
    ?assertMatch(#{claimed := 0, free := 1}, erlcuda_shm_slots:stats()).

%% A result the worker wrote into a result slot is read from the start of its part with one
%% pread, and the slot given back; a record that is not the slot's (more bytes than its
%% part, another part size) is refused unread, and the slot deleted.
result_read(Folder) ->
    {ok, Slot} = erlcuda_shm:result_slot(Folder, 8),
    ?assertMatch(#{part_bytes := ?MIB, parts := [_]}, Slot),
    %% its pages allocated before the worker writes through its mapping: a page a full
    %% /dev/shm could not give there would kill the worker
    Blocks = list_to_integer(string:trim(os:cmd("stat -c %b " ++ part(Folder, Slot, 0)))),
    ?assert(Blocks * 512 >= ?MIB),
    %% the worker writes its result from the part's start, as a mapping of the file does
    {ok, Fd} = file:open(part(Folder, Slot, 0), [read, write, raw, binary]),
    ok = file:pwrite(Fd, 0, <<1.0:32/float-little, 2.0:32/float-little, 9>>),
    ok = file:close(Fd),
    ?assertEqual({wire, ?WIRE_TAG_VECTOR, <<1.0:32/float-little, 2.0:32/float-little>>},
                 erlcuda_shm:take_result(Slot, 8, ?MIB)),
    ?assertMatch(#{claimed := 0, free := 1}, erlcuda_shm_slots:stats()),
    {ok, Again} = erlcuda_shm:result_slot(Folder, 8),
    ?assertEqual(maps:get(name, Slot), maps:get(name, Again)),
    ?assertEqual({wire, ?WIRE_TAG_VECTOR, <<>>}, erlcuda_shm:take_result(Again, 0, ?MIB)),
    [begin
         {ok, S} = erlcuda_shm:result_slot(Folder, 8),
         ?assertMatch({error, {internal, _}}, erlcuda_shm:take_result(S, Bytes, PartBytes)),
         ?assertEqual(ok, erlcuda_test_util:wait_until(
                            fun() -> not filelib:is_file(part(Folder, S, 0)) end, 50))
     end || {Bytes, PartBytes} <- [{?MIB + 1, ?MIB}, {8, 2 * ?MIB}, {1 bsl 40, 1 bsl 24}]],
    ?assertMatch(#{claimed := 0, free := 0}, erlcuda_shm_slots:stats()).

%% A result read by the slot's part process, which runs the reply itself (an alias's one
%% reply, erlcuda_delivery:run/3): the same record as take_result/3, in that process; the
%% reads it was given still run when its keeper dies at once after; a part that is gone
%% answers at once.
result_read_then(#{keeper := Keeper} = Folder) ->
    Self = self(),
    Then = fun(Tag) -> fun(R) -> Self ! {Tag, self(), R} end end,
    {ok, Slot} = erlcuda_shm:result_slot(Folder, 8),
    #{parts := [Part]} = Slot,
    {ok, Fd} = file:open(part(Folder, Slot, 0), [read, write, raw, binary]),
    ok = file:pwrite(Fd, 0, <<1.0:32/float-little, 2.0:32/float-little>>),
    ok = file:close(Fd),
    ok = erlcuda_shm:take_result_then(Slot, 8, ?MIB, Then(first)),
    ?assertEqual({first, Part, {wire, ?WIRE_TAG_VECTOR,
                                <<1.0:32/float-little, 2.0:32/float-little>>}},
                 receive {first, _, _} = M -> M after 5000 -> none end),
    ?assertMatch(#{claimed := 0, free := 1}, erlcuda_shm_slots:stats()),
    %% given a read, then its keeper gone: the read still runs, then the part ends
    {ok, Again} = erlcuda_shm:result_slot(Folder, 8),
    ok = erlcuda_shm:take_result_then(Again, 4, ?MIB, Then(second)),
    exit(Keeper, kill),
    ?assertEqual({second, Part, {wire, ?WIRE_TAG_VECTOR, <<1.0:32/float-little>>}},
                 receive {second, _, _} = M2 -> M2 after 5000 -> none end),
    ok = erlcuda_test_util:wait_until(fun() -> not is_process_alive(Part) end, 50),
    ok = erlcuda_shm_slots:read_then(Again, 4, Then(third)),
    ?assertMatch({third, Self, {error, {slot_gone, _}}},
                 receive {third, _, _} = M3 -> M3 after 5000 -> none end).

%% A slot deleted (its part told to stop, the stop maybe not yet read) before its result is
%% read: the read is answered at once, never handed to a part that ends without it; a read
%% handed over before the stop still runs.
result_read_then_deleted(Folder) ->
    Self = self(),
    Then = fun(Tag) -> fun(R) -> Self ! {Tag, R} end end,
    {ok, Slot} = erlcuda_shm:result_slot(Folder, 8),
    ok = erlcuda_shm_slots:discard(Slot),
    ok = erlcuda_shm:take_result_then(Slot, 8, ?MIB, Then(deleted)),
    ?assertMatch({deleted, {error, {internal, _}}},
                 receive {deleted, _} = M -> M after 5000 -> none end),
    {ok, Other} = erlcuda_shm:result_slot(Folder, 8),
    #{parts := [Part]} = Other,
    erlang:suspend_process(Part),  % both messages wait in its mailbox, the read first
    ok = erlcuda_shm:take_result_then(Other, 4, ?MIB, Then(before_stop)),
    Part ! stop,
    erlang:resume_process(Part),
    ?assertMatch({before_stop, {wire, ?WIRE_TAG_VECTOR, <<_:32>>}},
                 receive {before_stop, _} = M2 -> M2 after 5000 -> none end).

once(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ok = write(Slot, [<<1>>]),
    ok = erlcuda_shm_slots:discard(Slot),
    ok = erlcuda_shm_slots:release(Slot),  % too late: the slot was deleted
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> not filelib:is_regular(part(Folder, Slot, 0)) end, 50)),
    ?assertMatch(#{claimed := 0, free := 0, bytes := 0}, erlcuda_shm_slots:stats()),
    {ok, Kept} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ok = erlcuda_shm_slots:release(Kept),
    ok = erlcuda_shm_slots:discard(Kept),  % too late: given back, free for the next job
    ?assertMatch(#{claimed := 0, free := 1, bytes := ?MIB}, erlcuda_shm_slots:stats()).

grown(Folder) ->
    {ok, Slot} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ok = erlcuda_shm_slots:release(Slot),
    {ok, Grown} = erlcuda_shm_slots:claim(Folder, ?MIB, 3),
    ?assertEqual(maps:get(name, Slot), maps:get(name, Grown)),
    ?assertEqual(ok, write(Grown, [<<1>>, <<2>>, <<3>>])),
    ?assertEqual({ok, 3}, {ok, length(maps:get(parts, Grown))}),
    ?assertMatch(#{bytes := 3 * ?MIB}, erlcuda_shm_slots:stats()).

bounded(Folder) ->
    {ok, Big} = erlcuda_shm_slots:claim(Folder, 128 * ?MIB, 8),  % the pool's 1 GiB
    ?assertEqual(none, erlcuda_shm_slots:claim(Folder, ?MIB, 1)),
    ok = erlcuda_shm_slots:release(Big),
    ?assertEqual(none, erlcuda_shm_slots:claim(Folder, ?MIB, 1)),  % free, but of its size
    {ok, Again} = erlcuda_shm_slots:claim(Folder, 128 * ?MIB, 8),
    ok = erlcuda_shm_slots:discard(Again),
    ?assertMatch({ok, _}, erlcuda_shm_slots:claim(Folder, ?MIB, 1)).

swept(Folder) ->
    {ok, Idle} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ok = write(Idle, [<<1>>]),
    ok = erlcuda_shm_slots:release(Idle),
    ok = erlcuda_shm_slots:sweep(60000),
    ?assertMatch(#{free := 1}, erlcuda_shm_slots:stats()),
    timer:sleep(20),
    ok = erlcuda_shm_slots:sweep(10),
    ?assertMatch(#{free := 0, bytes := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> not filelib:is_regular(part(Folder, Idle, 0)) end, 50)),
    %% taken by a process that died before its job held the slot
    Self = self(),
    Taker = spawn(fun() -> Self ! {taken, erlcuda_shm_slots:claim(Folder, ?MIB, 1)} end),
    {ok, Orphan} = receive {taken, T} -> T after 5000 -> error(timeout) end,
    ok = erlcuda_test_util:wait_until(fun() -> not is_process_alive(Taker) end, 50),
    ok = write(Orphan, [<<1>>]),
    ok = erlcuda_shm_slots:sweep(60000),
    ?assertMatch(#{claimed := 0, free := 0, bytes := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> not filelib:is_regular(part(Folder, Orphan, 0)) end, 50)).

%% The keeper gone: a free slot's part ends with it; a taken slot's part writes nothing
%% more and ends once its job gives the slot up.
keeper_gone(#{dir := Dir, keeper := Keeper} = Folder) ->
    {ok, Taken} = erlcuda_shm_slots:claim(Folder, ?MIB, 2),
    {ok, Free} = erlcuda_shm_slots:claim(Folder, ?MIB, 1),
    ok = erlcuda_shm_slots:release(Free),
    [FreePart] = maps:get(parts, Free),
    [Pid | _] = maps:get(parts, Taken),
    exit(Keeper, kill),
    ok = erlcuda_test_util:wait_until(fun() -> not is_process_alive(FreePart) end, 50),
    ok = erlcuda_shm_slots:forget(Dir),
    ?assertMatch(#{free := 0, bytes := 2 * ?MIB}, erlcuda_shm_slots:stats()),
    ?assertMatch({error, _}, write(Taken, [<<1>>])),
    ?assert(is_process_alive(Pid)),
    %% the job that held one ends: nothing to give back to
    ok = erlcuda_shm_slots:release(Taken),
    ?assertMatch(#{free := 0, claimed := 0, bytes := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> not is_process_alive(Pid) end, 50)).

%% A worker that dies once it answered a result in a result slot: the port owner kills the
%% keeper and removes the folder (erlcuda_worker), and the job's deliverer asks for the read
%% only after that (it was sending the replies before it). The result is still read, from
%% the file the part holds open, and the slot goes once read.
result_read_past_keeper(#{dir := Dir, keeper := Keeper} = Folder) ->
    Want = <<1.0:32/float-little, 2.0:32/float-little>>,
    {ok, Slot} = erlcuda_shm:result_slot(Folder, 8),
    #{parts := [Part]} = Slot,
    {ok, Fd} = file:open(part(Folder, Slot, 0), [read, write, raw, binary]),
    ok = file:pwrite(Fd, 0, Want),
    ok = file:close(Fd),
    Mon = monitor(process, Keeper),
    exit(Keeper, kill),
    receive {'DOWN', Mon, process, Keeper, _} -> ok end,
    Taken = fun() -> erlcuda_test_util:keeper_end_taken(Part) end,
    ok = erlcuda_test_util:wait_until(Taken, 50),
    ok = erlcuda_shm:remove(Dir),
    ok = erlcuda_shm_slots:forget(Dir),
    ?assertEqual({wire, ?WIRE_TAG_VECTOR, Want}, erlcuda_shm:take_result(Slot, 8, ?MIB)),
    ?assertMatch(#{free := 0, claimed := 0, bytes := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> not is_process_alive(Part) end, 50)).

