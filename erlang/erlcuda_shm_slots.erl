%% @private
%% Slots: part files in the worker's shared-memory folder, kept from job to job, which carry
%% operands to the worker and results back.
%%
%% A new tmpfs file costs its pages as they are first written (allocated and zeroed): a
%% caller writes a fresh file at a fraction of the speed it writes pages that exist, and the
%% worker can only copy a fresh mapping to a GPU through pinned staging. A slot is written
%% again by each job that takes it: its pages stay, and the worker keeps it mapped and, from
%% its second use, registered for the GPU's copies (python/erlcuda/slots.py).
%%
%% A slot `s<N>' holds an operand of up to the contract's part count of parts, each part in
%% a file `s<N>.<K>' of the slot's part size, made that long (sparse) when the part is first
%% needed. Each part file belongs to a process of its own that holds it open and writes
%% each job's bytes at its start on request (`send_writes/2'): the parts of an operand are
%% written at once, each under its own inode's lock, and a write is one call to the file driver
%% rather than an open, a check and a close; it reads a result the worker wrote into the
%% part (`read/2') with one `pread' in the same way. A slot is taken by one job at a time
%% (`claim/3'), from the free slots of its part size, or made new while the slots' bytes stay
%% within ?POOL_BYTES; none: the job's operand goes in files of its own, as before.
%%
%% Who holds a slot: the claimed table says (one entry a slot taken, with the process that
%% took it), and taking that entry out is what gives the slot back, once. When a job's reply
%% comes the worker has done with its operands: the slot is free again (`release/1'). When
%% a job ends otherwise (its caller died or stopped waiting, its frame was never written)
%% the worker may still be reading it: the slot is deleted (`discard/1'), its files unlinked,
%% and the worker drops its mapping once it sees them gone. Free slots idle for `shm_keep_ms' and
%% slots taken by callers that died before their job was registered go at the port owner's
%% sweep (`sweep/1'). A worker's part processes are linked to a keeper process of its own:
%% the port owner kills the keeper when the worker goes, and the folder is removed with
%% everything in it. A part whose slot a job still holds then stays, reading from the file
%% it holds open, until that job gives the slot up: a result the worker wrote and answered
%% before it died is still read for its job.
-module(erlcuda_shm_slots).

-export([create/0, keeper/0, claim/3, claim_over/2, send_writes/2, written/1, reserve/1,
         read/2, read_then/3, release/1, discard/1, sweep/1, forget/1, stats/0]).

-export_type([slot/0]).

-include_lib("kernel/include/file.hrl").
-include_lib("kernel/include/logger.hrl").

-define(FREE, erlcuda_shm_free).
-define(CLAIMED, erlcuda_shm_claimed).
-define(COUNTERS, {?MODULE, counters}).
%% counters: slots made; bytes of the part files of live slots
-define(SEQ, 1).
-define(BYTES, 2).
%% The most bytes of slots' part files, taken or free.
-define(POOL_BYTES, (1 bsl 30)).
%% Tries to take a free slot another caller may take first.
-define(TRIES, 3).
%% How long a part's check that its file is still named holds for the writes that follow,
%% which are answered unchecked (`written_part/5'), in whole milliseconds of the monotonic
%% clock (so 5 to 6 ms): longer than a lone job's round trip up to a few million elements,
%% and a small part of the worker's period between sweeps of the files gone
%% (python/erlcuda/slots.py SWEEP_S).
-define(NAMED_MS, 5).
%% How often a part whose keeper died looks whether its slot is still taken, where no
%% `stop' came (`orphan/3').
-define(ORPHAN_LOOK_MS, 1000).

%% `reserved': its first part's pages were allocated for a result (erlcuda_shm:result_slot/2).
-type slot() :: #{seq := pos_integer(), dir := file:filename(), part_bytes := pos_integer(),
                  name := binary(), parts := [pid()], keeper := pid(), reserved => true}.

%% @doc The tables and counters; made by the application's process, so that they outlive
%% the port owner.
-spec create() -> ok.
create() ->
    ?FREE = ets:new(?FREE, [ordered_set, public, named_table]),
    ?CLAIMED = ets:new(?CLAIMED, [set, public, named_table, {write_concurrency, true}]),
    case persistent_term:get(?COUNTERS, undefined) of
        undefined -> persistent_term:put(?COUNTERS, atomics:new(2, [{signed, true}]));
        Counters -> atomics:put(Counters, ?BYTES, 0)
    end,
    ok.

%% @doc A keeper for one worker's slots: their part processes are linked to it. Linked to
%% the caller (the port owner), which kills it when the worker's folder goes.
-spec keeper() -> pid().
keeper() ->
    spawn_link(fun() -> receive stop -> ok end end).

%% @doc A slot of `PartBytes' parts with at least `Parts' of them, for the caller's job in
%% `Folder': a free one, or a new one within the pool's bytes; `none' otherwise.
-spec claim(erlcuda_shm:folder(), pos_integer(), pos_integer()) -> {ok, slot()} | none.
claim(#{dir := Dir, keeper := Keeper}, PartBytes, Parts) ->
    Slot = case take_free(Dir, PartBytes, ?TRIES) of
               {ok, Free} -> grow(Free, Parts);
               none -> new(Dir, Keeper, PartBytes, Parts)
           end,
    case Slot of
        #{seq := Seq} ->
            true = ets:insert(?CLAIMED, {Seq, self(), Slot}),
            {ok, Slot};
        none ->
            none
    end;
claim(_, _, _) ->
    none.

%% @doc A new slot of one part of `PartBytes' for the caller's job, made whatever room the
%% pool has left (a result has no other way to shared memory): counted, and deleted when
%% given back while the pool is over its bytes.
-spec claim_over(erlcuda_shm:folder(), pos_integer()) -> {ok, slot()} | none.
claim_over(#{dir := Dir, keeper := Keeper}, PartBytes) ->
    #{seq := Seq} = Slot = blank(Dir, Keeper, PartBytes),
    atomics:add(counters(), ?BYTES, PartBytes),
    Made = Slot#{parts := [spawn_part(Slot, 0)]},
    true = ets:insert(?CLAIMED, {Seq, self(), Made}),
    {ok, Made};
claim_over(_, _) ->
    none.

take_free(_, _, 0) ->
    none;
take_free(Dir, PartBytes, Tries) ->
    case ets:next(?FREE, {Dir, PartBytes, 0}) of
        {Dir, PartBytes, _} = Key ->
            case ets:take(?FREE, Key) of
                [{_, Slot, _}] -> {ok, Slot};
                [] -> take_free(Dir, PartBytes, Tries - 1)  % another caller took it first
            end;
        _ ->
            none
    end.

new(Dir, Keeper, PartBytes, Parts) ->
    grow(blank(Dir, Keeper, PartBytes), Parts).

%% A new slot's description, with its name (never used again) and no part yet.
blank(Dir, Keeper, PartBytes) ->
    Seq = atomics:add_get(counters(), ?SEQ, 1),
    #{seq => Seq, dir => Dir, part_bytes => PartBytes, keeper => Keeper,
      name => <<"s", (integer_to_binary(Seq))/binary>>, parts => []}.

%% The slot with `Parts' part processes at least, or `none' (the slot deleted) where the
%% pool has no room for the parts it lacks.
grow(#{parts := Pids} = Slot, Parts) when length(Pids) >= Parts ->
    Slot;
grow(#{parts := Pids, part_bytes := PartBytes} = Slot, Parts) ->
    More = (Parts - length(Pids)) * PartBytes,
    case atomics:add_get(counters(), ?BYTES, More) =< ?POOL_BYTES of
        true ->
            New = [spawn_part(Slot, K) || K <- lists:seq(length(Pids), Parts - 1)],
            Slot#{parts := Pids ++ New};
        false ->
            atomics:sub(counters(), ?BYTES, More),
            delete_slot(Slot),
            uncount(Slot),
            none
    end.

spawn_part(#{seq := Seq, dir := Dir, name := Name, part_bytes := PartBytes,
             keeper := Keeper}, K) ->
    Path = filename:join(Dir, <<Name/binary, ".", (integer_to_binary(K))/binary>>),
    spawn(fun() -> part(Keeper, Seq, Path, PartBytes) end).

%% @doc Ask for an operand's parts to be written into the slot, each by its part's process:
%% what `written/1' waits for. The operands of a job are all asked for before any is waited
%% for, so that they are written at once.
-spec send_writes(slot(), [binary()]) -> [reference()].
send_writes(#{parts := Pids}, Bins) ->
    [ask(Pid, {write, Bin}) || {Pid, Bin} <- lists:zip(lists:sublist(Pids, length(Bins)), Bins)].

%% @doc The writes asked for by `send_writes/2', once all are done: `ok' or the first
%% error.
-spec written([reference()]) -> ok | {error, term()}.
written(Refs) when is_list(Refs) ->
    case [R || R <- [answer(Ref) || Ref <- Refs], R =/= ok] of
        [] -> ok;
        [Error | _] -> Error
    end.

%% @doc The first `Bytes' bytes of the slot's first part, read by its process with one
%% `pread' (a result the worker wrote there): `{ok, Bin}', or `{error, Why}' where the
%% part's file is gone or holds less.
-spec read(slot(), non_neg_integer()) -> {ok, binary()} | {error, term()}.
read(#{parts := [Pid | _]}, Bytes) ->
    answer(ask(Pid, {read, Bytes})).

%% @doc `read/2' without a process waiting for it: the part's process reads and runs
%% `Then' on what `read/2' would answer, in that process (its reply sent from there, no
%% process in between). A part that is stopped still runs the reads it was given first, and
%% one whose keeper dies runs them until its job gives the slot up; for a slot given back
%% or deleted already (its part told to stop, or gone) `Then' runs here, on
%% `{error, {slot_gone, Why}}'.
-spec read_then(slot(), non_neg_integer(),
                fun(({ok, binary()} | {error, term()}) -> term())) -> ok.
read_then(#{seq := Seq, parts := [Pid | _]}, Bytes, Then) ->
    case {ets:member(?CLAIMED, Seq), is_process_alive(Pid)} of
        {true, true} -> Pid ! {{read, Bytes}, Then, none};
        {false, _} -> then(Then, {error, {slot_gone, not_claimed}});
        {true, false} -> then(Then, {error, {slot_gone, noproc}})
    end,
    ok.

%% @doc The slot's first part made and its pages allocated, for a result the worker writes
%% into it: `ok', or `{error, Why}' where it cannot be (a full /dev/shm: `enospc').
-spec reserve(slot()) -> ok | {error, term()}.
reserve(#{parts := [Pid | _]}) ->
    answer(ask(Pid, reserve)).

%% A request to a part's process, answered `{Ref, Result}' (`answer/1').
ask(Pid, Request) ->
    Ref = monitor(process, Pid),
    Pid ! {Request, self(), Ref},
    Ref.

answer(Ref) ->
    receive
        {Ref, Result} ->
            demonitor(Ref, [flush]),
            Result;
        {'DOWN', Ref, process, _, Why} ->
            {error, {slot_gone, Why}}
    end.

%% @doc The job that took the slot is answered: the slot is free for the next one (deleted
%% where the pool is over its bytes, `claim_over/2'). Only the first of release/1 and
%% discard/1 does anything.
-spec release(slot()) -> ok.
release(#{seq := Seq, keeper := Keeper} = Slot) ->
    case ets:take(?CLAIMED, Seq) of
        [_] ->
            case is_process_alive(Keeper) andalso
                atomics:get(counters(), ?BYTES) =< ?POOL_BYTES of
                true -> free(Slot, now_ms());
                false -> delete_slot(Slot), uncount(Slot)
            end;
        [] ->
            ok
    end.

free(#{seq := Seq, dir := Dir, part_bytes := PartBytes} = Slot, Since) ->
    true = ets:insert(?FREE, {{Dir, PartBytes, Seq}, Slot, Since}),
    ok.

%% @doc The job that took the slot ended while the worker may still read it: the slot is
%% deleted (its files unlinked; the worker's mapping keeps their pages while it reads).
-spec discard(slot()) -> ok.
discard(#{seq := Seq} = Slot) ->
    case ets:take(?CLAIMED, Seq) of
        [_] -> delete_slot(Slot), uncount(Slot);
        [] -> ok
    end.

delete_slot(#{parts := Pids}) ->
    _ = [Pid ! stop || Pid <- Pids],
    ok.

uncount(#{parts := Pids, part_bytes := PartBytes}) ->
    atomics:sub(counters(), ?BYTES, length(Pids) * PartBytes),
    ok.

%% @doc The port owner's sweep: free slots idle for `KeepMs' or of a worker gone, and slots
%% taken by callers that died before their job held them, are deleted.
-spec sweep(pos_integer()) -> ok.
sweep(KeepMs) ->
    Idle = now_ms() - KeepMs,
    Stale = ets:select(?FREE, [{{'$1', '$2', '$3'}, [{'<', '$3', Idle}], [{{'$1', '$2'}}]}])
        ++ [{Key, Slot} || {Key, #{keeper := K} = Slot, _} <- ets:tab2list(?FREE),
                           not is_process_alive(K)],
    _ = [begin delete_slot(Slot), uncount(Slot) end
         || {Key, Slot} <- Stale, ets:take(?FREE, Key) =/= []],
    Orphans = [Slot || {_, Claimer, Slot} <- ets:tab2list(?CLAIMED),
                       not is_process_alive(Claimer)],
    _ = [discard(Slot) || Slot <- Orphans],
    ok.

%% @doc A worker's folder is gone (its keeper with it): its free slots are forgotten.
-spec forget(file:filename()) -> ok.
forget(Dir) ->
    Keys = ets:select(?FREE, [{{{Dir, '_', '_'}, '_', '_'}, [], ['$_']}]),
    _ = [uncount(Slot) || {Key, Slot, _} <- Keys, ets:take(?FREE, Key) =/= []],
    ok.

%% @doc Slots free and taken, the bytes of their files, and how many were ever made (the
%% last one is `s<Made>').
-spec stats() -> #{free := non_neg_integer(), claimed := non_neg_integer(),
                   bytes := integer(), made := non_neg_integer()}.
stats() ->
    #{free => ets:info(?FREE, size), claimed => ets:info(?CLAIMED, size),
      bytes => atomics:get(counters(), ?BYTES), made => atomics:get(counters(), ?SEQ)}.

%% A part file's process: it makes the file (new, never through what stands at its path),
%% as long as a part, and writes each job's bytes at its start until told to stop, when it
%% deletes it. A file deleted under it (its folder removed, say) fails the write that finds
%% it gone and every later one (`linked/2'): the worker could not map it by its name, and
%% the job's data takes the pipe. That check is a second call to the file driver, a wake-up
%% of its own: before a write's answer it delays the job, and after it it would keep the
%% part's process busy while the job's caller goes on. So it is made before the write's
%% answer where the last one is older than ?NAMED_MS, and not at all otherwise (while jobs
%% follow each other on the slot, the worker maps the file already: its mapping and this
%% process's descriptor share the file's pages, named or not). A file deleted from outside
%% is found by the first write once the last check is over ?NAMED_MS old; the jobs written
%% before that, whose lane has no mapping of the file (another device's lane, or the
%% worker's sweep of files gone came between), fail with a shared-memory error rather than
%% go through the pipe. Taken for a result, the part's pages are allocated first
%% (`reserve/1'), once: the worker writes a result through its mapping, where a page a full
%% /dev/shm cannot give would kill it (SIGBUS). It ends with the worker's keeper, once the
%% reads it was given have run, or, where its slot is taken then, once its job gives the
%% slot up (`orphan/3').
part(Keeper, Seq, Path, PartBytes) ->
    logger:update_process_metadata(#{domain => [erlcuda]}),
    %% its keeper's end is a message: the reads it was given run first (`read_then/3')
    process_flag(trap_exit, true),
    link(Keeper),
    Opened = case file:open(Path, [raw, read, write, binary, exclusive]) of
                 {ok, Fd} ->
                     case sized(Fd, PartBytes) of
                         ok -> {ok, Fd};
                         {error, _} = Error -> _ = file:close(Fd), Error
                     end;
                 {error, _} = Error ->
                     Error
             end,
    part_loop(Opened, {Seq, Path}, PartBytes, false, never).

write_part({ok, Fd}, Path, Bin) ->
    case file:pwrite(Fd, 0, Bin) of
        ok -> ok;
        {error, Why} -> {error, {Path, Why}}
    end;
write_part({error, Why}, Path, _) ->
    {error, {Path, Why}}.

%% A write answered once its file is taken as named still: checked first where the last
%% check is older than ?NAMED_MS (`Named': when it was, or `never'), taken from that check
%% otherwise (which writes answered so do not renew). The file as it then stands, and when
%% it was last checked.
written_part(Opened, Path, Bin, {From, Ref}, Named) ->
    Now = erlang:monotonic_time(millisecond),
    case write_part(Opened, Path, Bin) of
        ok when Named =/= never, Now - Named =< ?NAMED_MS ->
            From ! {Ref, ok},
            {Opened, Named};
        ok ->
            {Written, Still} = linked(Opened, Path),
            From ! {Ref, Written},
            {Still, Now};
        {error, _} = Error ->
            From ! {Ref, Error},
            {Opened, Named}
    end.

%% After a write: `ok', or `{error, {Path, deleted}}' once the file's last name is gone (its
%% folder removed, say), which fails every later write too; and the file as it stands.
linked({ok, Fd} = Opened, Path) ->
    case file:read_file_info(Fd, [raw, {time, posix}]) of
        {ok, #file_info{links = 0}} ->
            _ = file:close(Fd),
            {{error, {Path, deleted}}, {error, deleted}};
        {ok, _} -> {ok, Opened};
        {error, Why} = Error -> _ = file:close(Fd), {{error, {Path, Why}}, Error}
    end.

%% The part's pages allocated (once), for a result the worker writes through its mapping.
reserve_part({ok, Fd}, Path, PartBytes) ->
    case file:allocate(Fd, 0, PartBytes) of
        ok -> ok;
        {error, Why} -> {error, {Path, Why}}
    end;
reserve_part({error, Why}, Path, _) ->
    {error, {Path, Why}}.

%% Exactly `Bytes' from the start: a read that comes back short would shrink its binary.
read_part({ok, _}, _, 0) ->
    {ok, <<>>};
read_part({ok, Fd}, Path, Bytes) ->
    case file:pread(Fd, 0, Bytes) of
        {ok, Bin} when byte_size(Bin) =:= Bytes -> {ok, Bin};
        {ok, Bin} -> {error, {Path, holds, byte_size(Bin), expected, Bytes}};
        eof -> {error, {Path, holds, 0, expected, Bytes}};
        {error, Why} -> {error, {Path, Why}}
    end;
read_part({error, Why}, Path, _) ->
    {error, {Path, Why}}.

sized(Fd, PartBytes) ->
    case file:position(Fd, PartBytes) of
        {ok, _} -> file:truncate(Fd);
        {error, _} = Error -> Error
    end.

part_loop(Opened, {Seq, Path} = Part, PartBytes, Reserved, Named) ->
    receive
        {{write, Bin}, From, Ref} ->
            {File, Checked} = written_part(Opened, Path, Bin, {From, Ref}, Named),
            part_loop(File, Part, PartBytes, Reserved, Checked);
        {reserve, From, Ref} when Reserved ->
            From ! {Ref, ok},
            part_loop(Opened, Part, PartBytes, Reserved, Named);
        {reserve, From, Ref} ->
            Done = reserve_part(Opened, Path, PartBytes),
            From ! {Ref, Done},
            part_loop(Opened, Part, PartBytes, Done =:= ok, Named);
        {{read, Bytes}, From, Ref} ->
            answer(From, Ref, read_part(Opened, Path, Bytes)),
            part_loop(Opened, Part, PartBytes, Reserved, Named);
        {'EXIT', _Keeper, _} ->
            case claimed(Seq) of
                true -> orphan(Opened, Path, Seq);
                false -> reads_left(Opened, Path), closed(Opened, Path)
            end;
        stop ->
            reads_left(Opened, Path),
            closed(Opened, Path)
    end.

%% A read for a process that waits for it, or one whose `Then' runs here.
answer(From, Ref, Read) when is_pid(From) -> From ! {Ref, Read};
answer(Then, _, Read) -> then(Then, Read).

%% A bug in one reply must not end the part's process with the slot.
then(Then, Read) ->
    try Then(Read)
    catch Class:Why:Stack ->
            ?LOG_ERROR("erlcuda: a result's delivery failed: ~0p", [{Class, Why, Stack}])
    end.

%% Its worker gone (the keeper with it) while a job holds its slot: a result the worker
%% wrote and answered may still be owed to that job, whose deliverer asks for the read
%% (`read/2') only when the replies before it are sent. So it stays, reading from the file
%% it holds open (its name gone with the worker's folder), until the job gives the slot up
%% (`release/1' or `discard/1' send `stop'); it writes nothing more, as the worker that
%% would map a write is gone. Should the claims' table go (the application stopped) no
%% `stop' can come: it looks again now and then.
orphan(Opened, Path, Seq) ->
    receive
        {{read, Bytes}, From, Ref} ->
            answer(From, Ref, read_part(Opened, Path, Bytes)),
            orphan(Opened, Path, Seq);
        {_, From, Ref} when is_pid(From), is_reference(Ref) ->
            From ! {Ref, {error, {slot_gone, keeper}}},
            orphan(Opened, Path, Seq);
        stop ->
            reads_left(Opened, Path),
            closed(Opened, Path)
    after ?ORPHAN_LOOK_MS ->
        case claimed(Seq) of
            true -> orphan(Opened, Path, Seq);
            false -> reads_left(Opened, Path), closed(Opened, Path)
        end
    end.

%% Whether the slot is taken; not where the table is gone with the application.
claimed(Seq) ->
    try ets:member(?CLAIMED, Seq)
    catch error:badarg -> false
    end.

%% The part ends (its keeper gone, or told to stop): the reads already given still run, from
%% the file it holds open, so that each of their jobs is answered.
reads_left(Opened, Path) ->
    receive
        {{read, Bytes}, From, Ref} ->
            answer(From, Ref, read_part(Opened, Path, Bytes)),
            reads_left(Opened, Path)
    after 0 ->
        ok
    end.

%% What stands at its path goes too where the file could not be made there: a name in the
%% worker's folder is erlcuda's (file:delete/2 follows no symlink).
closed(Opened, Path) ->
    _ = case Opened of {ok, Fd} -> file:close(Fd); {error, _} -> ok end,
    _ = file:delete(Path, [raw]),
    ok.

counters() ->
    persistent_term:get(?COUNTERS).

now_ms() ->
    erlang:monotonic_time(millisecond).
