%% @private
%% Large operands and results through shared memory: files in a folder of the worker's own
%% under `shm_dir' (default /dev/shm), instead of the port's pipe.
%%
%% The port owner makes a folder for each worker it starts (`erlcuda-<OsPid>-<N>', mode 0700,
%% with the worker's lock file) and removes it when that worker ends, or once its hello
%% says it could not take the folder; the worker's reaper process removes it too, even
%% when the node itself dies; and a worker removes, as it starts and every minute after,
%% the folders whose worker and reaper both died (python/erlcuda/shm.py says how it tells
%% them). A caller
%% writes its operands over the threshold into an operand slot (erlcuda_shm_slots: part
%% files kept from job to job, given back when the job's reply comes and deleted when the
%% job ends otherwise), or, where the slots have no room, to files of the job's own,
%% `i<JobId>-<Arg>.<K>' (after the job is registered, so that every path that ends the job
%% deletes them), which the worker unlinks once mapped. A result over the threshold goes into
%% a result slot the launch names (`result_slot/2': a slot of one part, taken with the
%% job's operands and ended as they are), which a deliverer (erlcuda_delivery) reads with one
%% `pread' and sends, so that the shared port owner never copies it; the slot is then given
%% back (`take_result/3'). With no slot to be had, the result takes the pipe.
%%
%% An operand is written as parts: the files `<Name>.0', `<Name>.1', ... of `part_bytes/1'
%% bytes each (the last one shorter; at most contract.json's `limits.shm_parts' parts, each
%% a whole number of ?PART_UNIT), each by a process of its own. Writes to one tmpfs file take
%% its inode's lock, so one file is written by one core at a time, where parts are written
%% by several at once. A result slot is one part as large as the result: read into one
%% binary in one call, where parts would have to be joined into a new binary, a copy of the
%% whole result.
%%
%% Only regular files of this folder are written or read, never what a symlink names nor a
%% FIFO: a part is written to a new file (whatever already stands at its path is refused),
%% and the slots' files are made here and held open, so a result is read from the file
%% Erlang made. A result record is trusted no further than its slot: one naming another
%% part size or more bytes than the slot holds is refused unread (and the slot deleted).
-module(erlcuda_shm).

-export([folder/1, remove/1, plan/3, result_slot/2, stage/1, kept/1, release/1, done/1,
         delete/1, take_result/3, take_result_then/4, part_bytes/1]).

-export_type([folder/0, plan/0, kept/0]).

-define(PREFIX, "erlcuda-").
%% The worker's lock in its folder (python/erlcuda/shm.py LOCK): held while it lives.
-define(LOCK, ".lock").
%% A part's size is a multiple of this, which is a multiple of every page size the worker
%% may map parts with.
-define(PART_UNIT, (1 bsl 20)).

%% A worker's folder, the size from which a vector travels through it, and the keeper of its
%% operand slots (erlcuda_shm_slots).
-type folder() :: #{dir := file:filename(), threshold := pos_integer(), keeper => pid()}.
%% What to write: `{File, Binary}' (a job's own part file), or a slot and its parts; and
%% the job's result slot, where it has one (nothing to write).
-type plan() :: [{file:filename(), binary()} | {slot, erlcuda_shm_slots:slot(), [binary()]}
                 | {result, erlcuda_shm_slots:slot()}].
%% What a job holds until it ends: its own files, its slots, its result slot.
-type kept() :: [file:filename() | {slot | result, erlcuda_shm_slots:slot()}].

%% @doc A new, empty folder for one worker under `Base'.
-spec folder(file:filename()) -> {ok, file:filename()} | {error, term()}.
folder(Base) ->
    Dir = filename:join(Base, ?PREFIX ++ os:getpid() ++ "-"
                        ++ integer_to_list(erlang:unique_integer([positive]))),
    case file:make_dir(Dir) of
        ok ->
            %% Operands are the callers' data: other users must not read them. The worker's
            %% lock file is made here, so that a shared-memory dir too full for it fails
            %% now, before any launch names the folder, rather than in the worker.
            Made = case file:change_mode(Dir, 8#700) of
                       ok -> file:write_file(filename:join(Dir, ?LOCK), <<>>, [raw, exclusive]);
                       {error, _} = Error -> Error
                   end,
            case Made of
                ok -> {ok, Dir};
                {error, Why} -> _ = file:del_dir_r(Dir), {error, {Dir, Why}}
            end;
        {error, Why} ->
            {error, {Dir, Why}}
    end.

%% @doc Remove a folder made by `folder/1' and what it holds.
-spec remove(file:filename() | undefined) -> ok.
remove(undefined) ->
    ok;
remove(Dir) ->
    case lists:prefix(?PREFIX, filename:basename(Dir)) of
        true -> _ = file:del_dir_r(Dir), ok;
        false -> ok
    end.

%% @doc Which of a job's arguments go through the folder: the arguments as the launch
%% names them (`{file, Name, Bytes, PartBytes}' for those) and the parts to write, in order.
-spec plan(folder() | none, erlcuda:job_id(), [erlcuda_job:arg()]) ->
    {[erlcuda_protocol:launch_arg()], plan()}.
plan(none, _, Args) ->
    {Args, []};
plan(#{threshold := Threshold} = Folder, JobId, Args) ->
    plan(Args, 1, Folder, Threshold, JobId, [], []).

plan([], _, _, _, _, Acc, Files) ->
    {lists:reverse(Acc), lists:append(lists:reverse(Files))};
plan([Bin | Rest], I, Folder, Threshold, JobId, Acc, Files)
  when is_binary(Bin), byte_size(Bin) >= Threshold ->
    {Name, Size, PartBytes, Parts} = parts_of(Bin, I, Folder, JobId),
    plan(Rest, I + 1, Folder, Threshold, JobId, [{file, Name, Size, PartBytes} | Acc],
         [Parts | Files]);
plan([{vector, Type, Bin} | Rest], I, Folder, Threshold, JobId, Acc, Files)
  when byte_size(Bin) >= Threshold ->
    {Name, Size, PartBytes, Parts} = parts_of(Bin, I, Folder, JobId),
    plan(Rest, I + 1, Folder, Threshold, JobId, [{file, Type, Name, Size, PartBytes} | Acc],
         [Parts | Files]);
plan([A | Rest], I, Folder, Threshold, JobId, Acc, Files) ->
    plan(Rest, I + 1, Folder, Threshold, JobId, [A | Acc], Files).

%% An operand's name and what to write: a slot where one is free or can be made, else files
%% of the job's own.
parts_of(Bin, I, #{dir := Dir} = Folder, JobId) ->
    Size = byte_size(Bin),
    PartBytes = part_bytes(Size),
    Cuts = parts(Dir, Size, PartBytes),
    case erlcuda_shm_slots:claim(Folder, PartBytes, length(Cuts)) of
        {ok, #{name := Slot} = S} ->
            {Slot, Size, PartBytes,
             [{slot, S, [binary_part(Bin, At, Len) || {_, At, Len} <- Cuts]}]};
        none ->
            Name = iolist_to_binary(["i", integer_to_list(JobId), "-", integer_to_list(I)]),
            Parts = [{Path, binary_part(Bin, At, Len)}
                     || {Path, At, Len} <- parts(filename:join(Dir, Name), Size, PartBytes)],
            {Name, Size, PartBytes, Parts}
    end.

%% @doc The bytes per part file of an operand of `Size' bytes.
-spec part_bytes(non_neg_integer()) -> pos_integer().
part_bytes(Size) ->
    max(1, ceil_div(ceil_div(Size, erlcuda_contract:shm_parts()), ?PART_UNIT)) * ?PART_UNIT.

%% The part files of a vector of Size bytes at Base: `{Path, Offset, Length}'.
parts(Base, Size, PartBytes) ->
    [{part_name(Base, K), K * PartBytes, min(PartBytes, Size - K * PartBytes)}
     || K <- lists:seq(0, max(1, ceil_div(Size, PartBytes)) - 1)].

part_name(Base, K) when is_binary(Base) ->
    <<Base/binary, ".", (integer_to_binary(K))/binary>>;
part_name(Base, K) ->
    Base ++ "." ++ integer_to_list(K).

ceil_div(A, B) ->
    (A + B - 1) div B.

%% @doc Write the planned parts, every operand's at once (each write runs on a dirty I/O
%% scheduler: the slots' writes are all asked for first, then a job's own files written,
%% then the slots' awaited); on failure, delete them all, and the slots. A job's own part is
%% a new file: one whose path is taken already (by a symlink, a FIFO, a directory, any
%% file) is an error, never written through; a slot's parts are written by the processes
%% that made them so.
-spec stage(plan()) -> ok | {error, binary()}.
stage(Plan) ->
    Asked = [{Name, erlcuda_shm_slots:send_writes(S, Bins)}
             || {slot, #{name := Name} = S, Bins} <- Plan],
    Own = [{F, B} || {F, B} <- Plan, is_binary(B)],
    %% Exclusive is O_CREAT | O_EXCL: any existing path fails with eexist, a symlink
    %% without being followed and a FIFO without being waited on.
    Written = in_parallel(fun({F, B}) -> {F, file:write_file(F, B, [raw, exclusive])} end,
                          Own),
    InSlots = [{Name, erlcuda_shm_slots:written(Refs)} || {Name, Refs} <- Asked],
    case checked(Written ++ InSlots, [F || {F, _} <- Own]) of
        ok -> ok;
        {error, _} = Error -> delete(kept(Plan)), Error
    end.

%% @doc What a job keeps until it ends, of what was planned for it.
-spec kept(plan()) -> kept().
kept(Plan) ->
    [case Item of
         {slot, S, _} -> {slot, S};
         {result, S} when is_map(S) -> {result, S};
         {F, _} -> F
     end || Item <- Plan].

%% @doc A job that was never registered gives back what was planned for it.
-spec release(plan()) -> ok.
release(Plan) ->
    lists:foreach(fun({slot, S, _}) -> erlcuda_shm_slots:release(S);
                     ({result, S}) when is_map(S) -> erlcuda_shm_slots:release(S);
                     (_) -> ok
                  end, Plan).

%% @doc A job is answered: its slots are free for the next job, its own files deleted.
-spec done(kept()) -> ok.
done(Kept) ->
    lists:foreach(fun({_, S}) when is_map(S) -> erlcuda_shm_slots:release(S);
                     (F) -> _ = file:delete(F, [raw])
                  end, Kept).

%% Fun on each element, each in a process of its own (one alone runs here); the results in
%% order. Linked: they die with a caller that dies. Unlinked once done, and any 'EXIT' of a
%% caller trapping exits taken.
in_parallel(Fun, [E]) ->
    [Fun(E)];
in_parallel(Fun, List) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {erlcuda_shm, self(), Fun(E)} end) || E <- List],
    Results = [receive {erlcuda_shm, Pid, R} -> R end || Pid <- Pids],
    _ = [begin
             unlink(Pid),
             receive {'EXIT', Pid, _} -> ok after 0 -> ok end
         end || Pid <- Pids],
    Results.

checked(Results, Files) ->
    case [{F, Why} || {F, {error, Why}} <- Results] of
        [] ->
            ok;
        [{File, Why} | _] ->
            delete(Files),
            {error, iolist_to_binary(io_lib:format("shared memory: writing ~ts: ~p",
                                                   [File, Why]))}
    end.

%% @doc Delete files (the parts of a job's operands or result) and slots (of a job that
%% ended while the worker may still read them); missing ones are fine.
-spec delete(kept()) -> ok.
delete(Files) ->
    lists:foreach(fun({_, S}) when is_map(S) -> erlcuda_shm_slots:discard(S);
                     (F) -> _ = file:delete(F, [raw])
                  end, Files).

%% @doc A result slot for a vector result of `Bytes' bytes: a slot of one part that holds
%% it all (read with one `pread' into one binary: parts would have to be joined, a copy of
%% the whole result), taken for the caller's job, and made past the pool's bytes where it
%% has no room (the pipe would hold every other job up); `none' where its pages cannot be
%% had (the result then takes the pipe).
-spec result_slot(folder(), non_neg_integer()) -> {ok, erlcuda_shm_slots:slot()} | none.
result_slot(Folder, Bytes) ->
    PartBytes = max(1, ceil_div(Bytes, ?PART_UNIT)) * ?PART_UNIT,
    Claimed = case erlcuda_shm_slots:claim(Folder, PartBytes, 1) of
                  none -> erlcuda_shm_slots:claim_over(Folder, PartBytes);
                  Taken -> Taken
              end,
    case Claimed of
        {ok, #{reserved := true}} ->
            Claimed;
        {ok, Slot} ->
            %% Its part file made, and its pages allocated, before the worker looks for it
            %% (a new slot's process makes the file as it starts; the worker writes through
            %% a mapping, where a page a full /dev/shm cannot give would kill it). Marked,
            %% so that the jobs that take it again skip the round trip to its part's process.
            case erlcuda_shm_slots:reserve(Slot) of
                ok -> {ok, Slot#{reserved => true}};
                {error, _} -> ok = erlcuda_shm_slots:discard(Slot), none
            end;
        none ->
            none
    end.

%% @doc A result the worker wrote into the job's result slot, as its record describes it,
%% read and the slot given back: the vector record it stands for, or `{error, {internal,
%% Text}}' where the record is not the slot's (another part size, more bytes than the part
%% holds) or the part cannot be read, and the slot is deleted.
-spec take_result(erlcuda_shm_slots:slot(), non_neg_integer(), pos_integer()) ->
    erlcuda_protocol:reply() | {error, erlcuda:reason()}.
take_result(#{part_bytes := PartBytes} = Slot, Bytes, PartBytes) when Bytes =< PartBytes ->
    taken(Slot, erlcuda_shm_slots:read(Slot, Bytes));
take_result(Slot, Bytes, PartBytes) ->
    not_its_slot(Slot, Bytes, PartBytes).

%% @doc `take_result/3' run by the slot's part process, which then runs `Then' on it
%% (`erlcuda_shm_slots:read_then/3'): nobody waits for the read.
-spec take_result_then(erlcuda_shm_slots:slot(), non_neg_integer(), pos_integer(),
                       fun((erlcuda_protocol:reply() | {error, erlcuda:reason()}) -> term())) ->
    ok.
take_result_then(#{part_bytes := PartBytes} = Slot, Bytes, PartBytes, Then)
  when Bytes =< PartBytes ->
    erlcuda_shm_slots:read_then(Slot, Bytes, fun(Read) -> Then(taken(Slot, Read)) end);
take_result_then(Slot, Bytes, PartBytes, Then) ->
    _ = Then(not_its_slot(Slot, Bytes, PartBytes)),
    ok.

taken(Slot, {ok, Bin}) ->
    ok = erlcuda_shm_slots:release(Slot),
    erlcuda_protocol:vector_reply(Bin);
taken(Slot, {error, Why}) ->
    ok = erlcuda_shm_slots:discard(Slot),
    internal("reading the result: ~0p", [Why]).

not_its_slot(#{part_bytes := Part} = Slot, Bytes, PartBytes) ->
    ok = erlcuda_shm_slots:discard(Slot),
    internal("a result record of ~b bytes in parts of ~b is not its slot's (parts of ~b)",
             [Bytes, PartBytes, Part]).

internal(Format, Args) ->
    {error, {internal, iolist_to_binary(["shared memory: ", io_lib:format(Format, Args)])}}.
