%% @private
%% The worker's wire format, and only this module knows it: how a launch and a control call
%% are framed, what the worker's frames mean, and the atoms it may send. The command line
%% that starts the worker and the check of its hello are erlcuda_worker_start's.
%%
%% Frames are a 4-byte big-endian length and that many bytes, on fds 3 and 4. The port is a
%% byte stream that `read/2' cuts: a frame takes the memory of the bytes that came, where
%% a `{packet, 4}' port reserves the whole length its header names at once, never to give
%% it back. The hot path is binary, fixed-layout frames
%% (contract.json's `wire' section, the macros of erlcuda_contract.hrl):
%%   to the worker:   a launch, `<<J, JobId:64, Device:16, Flags:8, KernelLen:8, Kernel,
%%                    NArgs:8, Args>>', each argument a vector (`<<V, Type:8, Bytes:64,
%%                    Data>>'), a dim (`<<D, N:64>>'), a vector in shared memory, a buffer
%%                    (`<<H, BufferId:64>>'), a scalar (`<<S, Type:8, Value:8/binary>>') or
%%                    a zeroed vector the worker makes (`<<E, Type:8, Elements:64>>'); then,
%%                    with flags.keep, `<<NKeep:8, BufferId:64 ...>>', and with
%%                    flags.geometry `<<GX:32, GY:32, GZ:32, BX:32, BY:32, BZ:32,
%%                    Shared:32>>', and with flags.program `<<DefLen:32, Def>>' (a
%%                    program's definition, erlcuda_program: the arguments are its
%%                    inputs); or a batch of launches,
%%                    `<<B, Count:32, [<<Size:32, Launch:Size>>]>>';
%%   from the worker: results, `<<R, Count:32, Records>>', one frame per batch, each record
%%                    `<<JobId:64, Tag:8, Len:32, Payload:Len>>': a vector (f32, or typed),
%%                    a scalar, an error, a result file, a buffer, or a list of those; or,
%%                    for a launch with flags.floats, an f32 vector as the ETF of the list
%%                    of its floats, which its caller decodes in one `binary_to_term'.
%% Control calls and logs are one term each, in erlport's shapes:
%%   to the worker:   `{'C', Id, erlcuda, Function, Args}'
%%   from the worker: `{'r', Id, Reply}', `{'e', Id, Error}', `{'L', Level, Text}'.
-module(erlcuda_protocol).

-export([encode_launch/5, encode_batch/1, batch_overhead/1, encode_call/3, reader/0, read/2,
         decode/1, each_result/3, message/4, message/5, f32_list/1, float_list/1, finish/2,
         max_result_bytes/0, file_result/1, vector_reply/1, fits/2, load_atoms/0]).

-export_type([event/0, reply/0, launch_arg/0, flags/0, file_arg/0, file_result/0,
              ctx/0, shape/0, raw/0, expect/0, reader/0]).

-include("erlcuda_contract.hrl").

-type event() :: {results, binary()}
               | {answer, pos_integer(), {ok, term()} | {error, term()}}
               | {log, logger:level(), unicode:chardata()}
               | {unexpected, term()}
               | {undecodable, non_neg_integer()}.
%% One job's record of a results frame: its tag and payload, still undecoded; a traced
%% job's with the time (monotonic, nanoseconds) the port owner took up its frame.
-type reply() :: {wire, byte(), binary()} | {traced, integer(), binary()}.
%% A launch's argument: a vector's bytes, a dim, or a vector in the worker's shared-memory
%% folder (its files' name, its size and the bytes per part file).
-type launch_arg() :: erlcuda_job:arg() | file_arg().
-type file_arg() :: {file, Name :: binary(), Bytes :: non_neg_integer(),
                     PartBytes :: pos_integer()}
                  | {file, erlcuda_vector:type(), Name :: binary(),
                     Bytes :: non_neg_integer(), PartBytes :: pos_integer()}.
%% A result the worker left in shared memory: its size and the bytes per part file.
-type file_result() :: {file, Bytes :: non_neg_integer(), PartBytes :: pos_integer()}.
%% keep: the ids the job's vector results are kept under; geometry: a user kernel's shape.
%% `result_file': false, or the result slot a vector result goes to (its name and part size).
%% floats: an f32 vector result wanted as floats (`float_list/1').
-type flags() :: #{trace := boolean(), result_file := false | {binary(), pos_integer()},
                   keep => [erlcuda_buffers:id()], geometry => erlcuda_job:geometry(),
                   program => binary(), floats => boolean()}.
%% How a reply of the general path is shaped: as its one record (`value'), always a list
%% (a raw user kernel's written vectors), or the one item of a list (an elementwise kernel
%% with one output).
-type shape() :: value | list | single.
%% What a job of the general path needs to make its reply: the epoch and device its
%% buffers are made in, the buffers it used (to name one the worker lost) and its shape.
-type ctx() :: none | #{epoch := non_neg_integer(), device := non_neg_integer(),
                        buffers := [erlcuda:buffer()], shape := shape(),
                        keep := [erlcuda_buffers:id()]}.
%% What is left of the worker's stream between two reads: a part of a frame header, or the
%% chunks of a frame not yet whole (the bytes it needs in all, and has).
-opaque reader() :: binary()
                  | {pending, pos_integer(), non_neg_integer(), [binary(), ...]}.
%% What a job's reply must be: a vector of so many elements of a type (as data, or in
%% shared memory), a scalar, or anything (what the launch does not fix).
-type expect() :: {vector, erlcuda_vector:type(), non_neg_integer()} | scalar
                | {list, non_neg_integer()} | {keep, [erlcuda_buffers:id()]} | any.
%% A result decoded but not yet made into Erlang terms: vectors still binaries (an f32
%% vector sent as floats: the ETF of their list).
-type raw() :: {vec, erlcuda_vector:type(), binary()} | {floats, binary()} | {scalar, float()}
             | {buffer, erlcuda:buffer()} | [raw()].

%% The launch frame's bytes besides its arguments' data, at most.
-define(LAUNCH_OVERHEAD, 512).
%% The ETF of a list of N floats: version, LIST_EXT and N, N times NEW_FLOAT_EXT and the
%% value, NIL_EXT.
-define(FLOAT_LIST_BYTES(N), (6 + 9 * (N) + 1)).
-define(NON_FINITE_VECTOR, <<"the result holds an infinity or NaN, which Erlang floats "
                             "cannot hold; {format, binary} returns the raw f32 values">>).

%% @doc The launch as one frame, built as an iolist: the vectors go into the port's writev
%% as they are, never copied. `too_large' when the frame would not fit its 4-byte length.
-spec encode_launch(JobId :: erlcuda:job_id(), Device :: non_neg_integer(), Kernel :: atom(),
                    Args :: [launch_arg()], flags()) ->
    {ok, iolist()} | {error, too_large}.
encode_launch(JobId, Device, Kernel, Args, #{trace := Trace, result_file := ResultFile} = F) ->
    Payload = lists:sum([payload(A) || A <- Args]),
    Keep = maps:get(keep, F, none),
    Geometry = maps:get(geometry, F, none),
    Program = maps:get(program, F, none),
    case Payload + program_size(Program) + ?LAUNCH_OVERHEAD + 16 * length(Args)
        > erlcuda_contract:max_frame() of
        true ->
            {error, too_large};
        false ->
            Name = atom_to_binary(Kernel, utf8),
            Flags = case Trace of true -> ?WIRE_FLAG_TRACE; false -> 0 end
                bor case ResultFile of false -> 0; _ -> ?WIRE_FLAG_RESULT_FILE end
                bor case Keep of none -> 0; _ -> ?WIRE_FLAG_KEEP end
                bor case Geometry of none -> 0; _ -> ?WIRE_FLAG_GEOMETRY end
                bor case Program of none -> 0; _ -> ?WIRE_FLAG_PROGRAM end
                bor case maps:get(floats, F, false) of true -> ?WIRE_FLAG_FLOATS; false -> 0 end,
            {ok, framed([<<?WIRE_LAUNCH, JobId:64, Device:16, Flags:8, (byte_size(Name)):8,
                           Name/binary, (length(Args)):8>>
                         | [arg(A) || A <- Args]]
                        ++ keep(Keep) ++ geometry(Geometry) ++ program(Program)
                        ++ result_slot(ResultFile))}
    end.

%% A frame: its length, then its bytes.
framed(Body) ->
    [<<(iolist_size(Body)):32>> | Body].

payload(Bin) when is_binary(Bin) -> byte_size(Bin);
payload({vector, _, Bin}) -> byte_size(Bin);
payload(_) -> 0.

keep(none) -> [];
keep(Ids) -> [<<(length(Ids)):8, << <<Id:64>> || Id <- Ids >>/binary>>].

program_size(none) -> 0;
program_size(Def) -> 4 + byte_size(Def).

program(none) -> [];
program(Def) -> [<<(byte_size(Def)):32>>, Def].

result_slot(false) -> [];
result_slot({Name, PartBytes}) -> [<<PartBytes:64, (byte_size(Name)):8, Name/binary>>].

geometry(none) -> [];
geometry({{GX, GY, GZ}, {BX, BY, BZ}, Shared}) ->
    [<<GX:32, GY:32, GZ:32, BX:32, BY:32, BZ:32, Shared:32>>].

%% @doc Several launch frames (as `encode_launch/5' made them, each with its length) as one
%% batch frame, in order.
-spec encode_batch([iodata()]) -> iolist().
encode_batch(Frames) ->
    framed([<<?WIRE_BATCH, (length(Frames)):32>> | Frames]).

%% @doc The bytes a batch of `Count' launch frames adds to them, besides its own length:
%% its tag and count (each launch brings its length prefix).
-spec batch_overhead(non_neg_integer()) -> non_neg_integer().
batch_overhead(_Count) ->
    5.

%% A plain binary is an f32 vector: the built-in kernels' launches name no type.
arg(Bin) when is_binary(Bin) ->
    [<<?WIRE_ARG_VECTOR, ?ELEMENT_INDEX_F32:8, (byte_size(Bin)):64>>, Bin];
arg(N) when is_integer(N) -> <<?WIRE_ARG_DIM, N:64>>;
arg({file, Name, Bytes, PartBytes}) ->
    <<?WIRE_ARG_FILE, ?ELEMENT_INDEX_F32:8, Bytes:64, PartBytes:64, (byte_size(Name)):8,
      Name/binary>>;
arg({vector, Type, Bin}) ->
    [<<?WIRE_ARG_VECTOR, (erlcuda_vector:index(Type)):8, (byte_size(Bin)):64>>, Bin];
arg({file, Type, Name, Bytes, PartBytes}) ->
    <<?WIRE_ARG_FILE, (erlcuda_vector:index(Type)):8, Bytes:64, PartBytes:64,
      (byte_size(Name)):8, Name/binary>>;
arg({handle, Id}) -> <<?WIRE_ARG_HANDLE, Id:64>>;
arg({scalar, Type, <<_:64>> = Value}) ->
    <<?WIRE_ARG_SCALAR, (erlcuda_vector:index(Type)):8, Value/binary>>;
arg({empty, Type, N}) -> <<?WIRE_ARG_EMPTY, (erlcuda_vector:index(Type)):8, N:64>>.

%% @doc Where a result the worker left in shared memory is, if `Reply' is one. A record
%% naming parts smaller than a page, or more than 65536 of them, is no such result (and
%% reads as malformed): nothing from the worker makes this side open files without bound.
-spec file_result(reply()) -> file_result() | no.
file_result({wire, ?WIRE_TAG_FILE, <<Bytes:64, PartBytes:64>>})
  when PartBytes >= 4096, Bytes =< PartBytes bsl 16 ->
    {file, Bytes, PartBytes};
file_result(_) ->
    no.

%% @doc Whether a job's record is of the kind, element type and length its job expects, or
%% names the buffers it was to keep: a worker that answered another job's id with its record
%% is caught here, not believed. An error fits every job.
-spec fits(expect(), reply()) -> boolean().
fits(any, _) ->
    true;
fits(_, {wire, ?WIRE_TAG_ERROR, _}) ->
    true;
fits(Expect, {traced, _, <<Tag:8, Len:32, Inner:Len/binary, _/binary>>}) ->
    fits(Expect, {wire, Tag, Inner});
fits({keep, Ids}, {wire, ?WIRE_TAG_HANDLE, <<Id:64, _/binary>>}) ->
    lists:member(Id, Ids);
fits({keep, _} = Keep, {wire, ?WIRE_TAG_LIST, <<_:32, Items/binary>>}) ->
    items_fit(Keep, Items);
fits({keep, _}, _) ->
    %% scalars, and what is not kept
    true;
fits(scalar, {wire, ?WIRE_TAG_SCALAR, <<_:64>>}) ->
    true;
fits({list, N}, {wire, ?WIRE_TAG_LIST, <<Count:32, _/binary>>}) ->
    Count =:= N;
fits({vector, f32, N}, {wire, ?WIRE_TAG_VECTOR, Bin}) ->
    byte_size(Bin) =:= ?ELEMENT_SIZE_F32 * N;
fits({vector, f32, N}, {wire, ?WIRE_TAG_FLOATS, Etf}) ->
    byte_size(Etf) =:= ?FLOAT_LIST_BYTES(N);
fits({vector, Type, N}, {wire, ?WIRE_TAG_TYPED, <<Index:8, Bin/binary>>}) ->
    erlcuda_vector:type(Index) =:= Type andalso byte_size(Bin) =:= N * erlcuda_vector:size(Type);
fits({vector, Type, N}, {wire, ?WIRE_TAG_FILE, <<Bytes:64, _:64>>}) ->
    Bytes =:= N * erlcuda_vector:size(Type);
fits(_, _) ->
    false.

items_fit(Expect, <<Tag:8, Len:32, Payload:Len/binary, Rest/binary>>) ->
    fits(Expect, {wire, Tag, Payload}) andalso items_fit(Expect, Rest);
items_fit(_, _) ->
    %% a list cut short reads as malformed when its reply is made
    true.

%% @doc A vector result read from shared memory, as if its record had carried it.
-spec vector_reply(binary()) -> reply().
vector_reply(Bin) ->
    {wire, ?WIRE_TAG_VECTOR, Bin}.

%% @doc The largest result one record of a results frame can carry.
-spec max_result_bytes() -> pos_integer().
max_result_bytes() ->
    %% the frame's tag and count, and the record's job id, tag and length
    erlcuda_contract:max_frame() - (1 + 4) - (8 + 1 + 4).

%% @doc A control call: the worker answers `{'r', Id, Reply}' or `{'e', Id, Error}'. Id 0
%% is no call the port owner made and waits for (a `free'): the worker sends no answer (it
%% logs a failure), so neither pipe nor port owner carries one per free.
-spec encode_call(non_neg_integer(), atom(), list()) -> iolist().
encode_call(Id, Function, Args) ->
    framed([term_to_binary({'C', Id, erlcuda, Function, Args})]).

%% @doc A reader of the worker's byte stream, before any byte came.
-spec reader() -> reader().
reader() ->
    <<>>.

%% @doc The whole frames that `Bytes', coming after what `Reader' holds, complete, and
%% the reader of what is left. Nothing is reserved for a length: a frame takes the memory
%% of the bytes that came, whatever its header says. The chunks of a frame not yet whole
%% are kept apart and joined once, when its last byte comes (appending each chunk to a
%% binary that was matched would copy it all again every time).
-spec read(binary(), reader()) -> {[binary()], reader()}.
read(Bytes, {pending, Need, Have, Chunks}) when Have + byte_size(Bytes) < Need ->
    {[], {pending, Need, Have + byte_size(Bytes), [Bytes | Chunks]}};
read(Bytes, {pending, _, _, Chunks}) ->
    cut(iolist_to_binary(lists:reverse(Chunks, [Bytes])), []);
read(Bytes, <<>>) ->
    cut(Bytes, []);
read(Bytes, Head) ->
    cut(<<Head/binary, Bytes/binary>>, []).

cut(<<Len:32, Frame:Len/binary, Rest/binary>>, Acc) ->
    cut(Rest, [Frame | Acc]);
cut(<<Len:32, _/binary>> = Part, Acc) ->
    {lists:reverse(Acc), {pending, Len + 4, byte_size(Part), [Part]}};
cut(Head, Acc) ->
    {lists:reverse(Acc), Head}.

%% @doc What a frame from the worker is. Terms are decoded with `[safe]': the worker can
%% make no atom the node does not already know.
-spec decode(binary()) -> event().
decode(<<?WIRE_RESULTS, _Count:32, Records/binary>>) ->
    {results, Records};
decode(<<131, 80, _/binary>> = Frame) ->
    %% The worker never compresses: a compressed term could inflate without bound here.
    {undecodable, byte_size(Frame)};
decode(<<131, _/binary>> = Frame) ->
    try binary_to_term(Frame, [safe]) of
        {'r', Id, Reply} when is_integer(Id) -> {answer, Id, {ok, Reply}};
        {'e', Id, Error} when is_integer(Id) -> {answer, Id, {error, Error}};
        {'L', Level, Text} when is_binary(Text) -> {log, log_level(Level), Text};
        Other -> {unexpected, Other}
    catch
        error:badarg -> {undecodable, byte_size(Frame)}
    end;
decode(Frame) ->
    {undecodable, byte_size(Frame)}.

%% @doc Call `Fun(JobId, Reply)' for each record of a results frame, in order; `malformed'
%% when the records do not parse to their end (the ones before were delivered), and
%% `{mismatch, JobId}' when `Fun' found a record that does not fit its job (the ones after
%% it are left). `Since' is when the frame was taken up (`erlang:monotonic_time/1' in
%% nanoseconds): a traced job's `forward' stage is timed from it.
-spec each_result(fun((erlcuda:job_id(), reply()) -> term()), binary(), integer()) ->
    ok | malformed | {mismatch, erlcuda:job_id()}.
each_result(Fun, <<JobId:64, Tag:8, Len:32, Payload:Len/binary, Rest/binary>>, Since) ->
    Reply = case Tag of
                ?WIRE_TAG_TRACED -> {traced, Since, Payload};
                _ -> {wire, Tag, Payload}
            end,
    case Fun(JobId, Reply) of
        mismatch -> {mismatch, JobId};
        _ -> each_result(Fun, Rest, Since)
    end;
each_result(_, <<>>, _) ->
    ok;
each_result(_, _, _) ->
    malformed.

%% @doc The message a job's caller receives for its record. A vector for a `list' format
%% caller that waits in `launch_sync' travels as `{f32, Binary}' (sent as floats, `{floats,
%% Etf}'; from the general path, `{deferred, Raw}'): the caller turns it into numbers itself
%% (`f32_list/1', `float_list/1', `finish/2'), not this shared process.
-spec message(erlcuda:job_id() | reference(), reply(), erlcuda:format(), boolean()) ->
    tuple().
message(JobId, Reply, Format, Sync) ->
    message(JobId, Reply, Format, Sync, none).

%% @doc `message/4' for a job of the general path, given what its reply needs (`ctx()').
-spec message(erlcuda:job_id() | reference(), reply(), erlcuda:format(), boolean(), ctx()) ->
    tuple().
message(JobId, {traced, Since, <<Tag:8, Len:32, Inner:Len/binary, Stamps/binary>>},
        Format, _Sync, Ctx) ->
    Forward = erlang:monotonic_time(nanosecond) - Since,
    case term(Stamps) of
        {ok, Map} when is_map(Map) ->
            {erlcuda, JobId, result({wire, Tag, Inner}, Format, false, Ctx),
             Map#{<<"forward">> => Forward}};
        _ ->
            {erlcuda, JobId, malformed()}
    end;
message(JobId, {traced, _, _}, _, _, _) ->
    {erlcuda, JobId, malformed()};
message(JobId, Reply, Format, Sync, Ctx) ->
    {erlcuda, JobId, result(Reply, Format, Sync, Ctx)}.

%% A record as its caller's result: decoded once (`raw/2'), then made into what `Format'
%% asks. A plain launch's f32 vector for a `launch_sync' caller travels as `{f32, Bin}' (or,
%% sent as floats, `{floats, Etf}'), any other vector for one as `{deferred, Raw}': that
%% caller makes the numbers itself.
result(Reply, Format, Sync, Ctx) ->
    case raw(Reply, Ctx) of
        {ok, Raw} -> made(shape(Raw, Ctx), Format, Sync, Ctx);
        {error, _} = Error -> Error
    end.

%% Vectors that stay binaries are owned here (`own/1'); one made into numbers needs no copy.
made({vec, _, Bin}, binary, _, _) -> {ok, own(Bin)};
made({vec, f32, Bin}, list, true, none) -> {f32, own(Bin)};
made({vec, f32, Bin}, list, false, none) -> f32_list(Bin);
made({floats, Etf}, list, true, none) -> {floats, own(Etf)};
made({floats, Etf}, list, false, none) -> float_list(Etf);
made({scalar, F}, _, _, _) -> {ok, F};
made(Raw, list, true, _) ->
    case has_vector(Raw) of
        true -> {deferred, owned(Raw)};
        false -> finish(Raw, list)
    end;
made(Raw, list, false, _) ->
    finish(Raw, list);
made(Raw, binary, _, _) ->
    finish(owned(Raw), binary).

owned({vec, Type, Bin}) -> {vec, Type, own(Bin)};
owned(List) when is_list(List) -> [owned(R) || R <- List];
owned(Raw) -> Raw.

%% One record (or a list's item) decoded, the one reading of every tag; vectors stay
%% sub-binaries of the frame.
raw({wire, ?WIRE_TAG_VECTOR, Bin}, _) when byte_size(Bin) rem ?ELEMENT_SIZE_F32 =:= 0 ->
    {ok, {vec, f32, Bin}};
raw({wire, ?WIRE_TAG_TYPED, <<Index:8, Bin/binary>>}, _) ->
    case erlcuda_vector:type(Index) of
        error -> malformed();
        Type ->
            case byte_size(Bin) rem erlcuda_vector:size(Type) of
                0 -> {ok, {vec, Type, Bin}};
                _ -> malformed()
            end
    end;
raw({wire, ?WIRE_TAG_FLOATS, <<131, 108, N:32, _/binary>> = Etf}, _)
  when byte_size(Etf) =:= ?FLOAT_LIST_BYTES(N) ->
    {ok, {floats, Etf}};
raw({wire, ?WIRE_TAG_SCALAR, <<F:64/float-little>>}, _) ->
    {ok, {scalar, F}};
raw({wire, ?WIRE_TAG_SCALAR, <<_:64>>}, _) ->
    {error, {non_finite, <<"the result is an infinity or NaN; Erlang floats cannot hold it">>}};
raw({wire, ?WIRE_TAG_HANDLE, <<Id:64, Index:8, Elements:64>>},
    #{epoch := Epoch, device := Device}) ->
    case erlcuda_vector:type(Index) of
        error -> malformed();
        Type -> {ok, {buffer, {erlcuda_buffer, node(), Epoch, Device, Id, Type, Elements}}}
    end;
raw({wire, ?WIRE_TAG_LIST, <<Count:32, Items/binary>>}, Ctx) ->
    items(Count, Items, Ctx, []);
raw({wire, ?WIRE_TAG_ERROR, Etf}, Ctx) ->
    case term(Etf) of
        {ok, Reason} -> {error, lost(Reason, Ctx)};
        error -> malformed()
    end;
raw(_, _) ->
    malformed().

items(0, <<>>, _, Acc) ->
    {ok, lists:reverse(Acc)};
items(N, <<Tag:8, Len:32, Payload:Len/binary, Rest/binary>>, Ctx, Acc)
  when N > 0, Tag =/= ?WIRE_TAG_LIST ->
    case raw({wire, Tag, Payload}, Ctx) of
        {ok, Item} -> items(N - 1, Rest, Ctx, [Item | Acc]);
        {error, _} = Error -> Error
    end;
items(_, _, _, _) ->
    malformed().

shape(Raw, none) -> Raw;
shape(Raw, #{shape := value}) -> Raw;
shape(Raw, #{shape := list}) when is_list(Raw) -> Raw;
shape(Raw, #{shape := list}) -> [Raw];
shape([Raw], #{shape := single}) -> Raw;
shape(Raw, #{shape := single}) -> Raw.

has_vector({vec, _, _}) -> true;
has_vector(L) when is_list(L) -> lists:any(fun has_vector/1, L);
has_vector(_) -> false.

%% The worker names a buffer it does not hold by its id: the caller gets its handle.
lost({buffer_lost, Id}, #{buffers := Buffers}) when is_integer(Id) ->
    case [B || {erlcuda_buffer, _, _, _, I, _, _} = B <- Buffers, I =:= Id] of
        [B | _] -> {buffer_lost, B};
        [] -> {buffer_lost, Id}
    end;
%% A step's kernel the worker no longer has is named as the definition names it, an atom,
%% as every `unknown_kernel' is (the worker names a kernel it does not know by its text).
lost({step, I, {unknown_kernel, Name}}, _) when is_binary(Name) ->
    try {step, I, {unknown_kernel, binary_to_existing_atom(Name, utf8)}}
    catch error:badarg -> {step, I, {unknown_kernel, Name}}
    end;
lost(Reason, _) ->
    Reason.

%% @doc A decoded result made into Erlang terms: vectors as lists of numbers, or as
%% binaries with `binary'.
-spec finish(raw(), erlcuda:format()) -> {ok, term()} | {error, erlcuda:reason()}.
finish(Raw, Format) ->
    try {ok, finish1(Raw, Format)}
    catch throw:{error, _} = Error -> Error
    end.

finish1({vec, _, Bin}, binary) -> Bin;
finish1({floats, _}, binary) -> throw(malformed());
finish1({floats, Etf}, list) ->
    case float_list(Etf) of
        {ok, List} -> List;
        {error, _} = Error -> throw(Error)
    end;
finish1({vec, Type, Bin}, list) ->
    case erlcuda_vector:unpack(Type, Bin) of
        {ok, List} -> List;
        {error, _} = Error -> throw(Error)
    end;
finish1({scalar, F}, _) -> F;
finish1({buffer, B}, _) -> B;
finish1(List, Format) when is_list(List) -> [finish1(R, Format) || R <- List].

%% @doc An f32 vector result the worker sent as floats (the ETF of their list, which
%% `raw/2' checked the length of): the list, made in one call; `non_finite' where it holds
%% an infinity or NaN (which `binary_to_term' refuses), `{internal, _}' where it is no list
%% of that many floats.
-spec float_list(binary()) ->
    {ok, [float()]} | {error, {non_finite | internal, binary()}}.
float_list(<<131, 108, N:32, Items/binary>> = Etf) ->
    Size = byte_size(Etf),
    try binary_to_term(Etf, [safe, used]) of
        {List, Size} ->
            case floats(List, N) of
                true -> {ok, List};
                false -> malformed()
            end;
        _ ->
            malformed()
    catch
        error:badarg ->
            case float_items(Items) of
                true -> {error, {non_finite, ?NON_FINITE_VECTOR}};
                false -> malformed()
            end
    end.

%% Whether a list is of `N' floats (and proper): a term of the payload's length may hold
%% other items.
floats([A, B, C, D, E, F, G, H | T], N)
  when is_float(A), is_float(B), is_float(C), is_float(D), is_float(E), is_float(F),
       is_float(G), is_float(H), N >= 8 ->
    floats(T, N - 8);
floats([A | T], N) when is_float(A), N > 0 ->
    floats(T, N - 1);
floats([], 0) ->
    true;
floats(_, _) ->
    false.

%% Whether a float list's items are floats (NEW_FLOAT_EXT), whatever their values, and
%% end it.
float_items(<<70, _:64, Rest/binary>>) -> float_items(Rest);
float_items(<<106>>) -> true;
float_items(_) -> false.

%% @doc A vector result as floats; `non_finite' where it holds an infinity or NaN.
-spec f32_list(binary()) -> {ok, [float()]} | {error, {non_finite, binary()}}.
f32_list(Bin) ->
    case erlcuda_vector:unpack(f32, Bin) of
        {ok, _} = Ok -> Ok;
        {error, {non_finite, _}} -> {error, {non_finite, ?NON_FINITE_VECTOR}}
    end.

%% A result is a sub-binary of its batch's frame: one that is most of the frame keeps it,
%% a smaller one is copied, so a kept result does not keep other callers' results alive.
own(Bin) ->
    case byte_size(Bin) * 2 < binary:referenced_byte_size(Bin) of
        true -> binary:copy(Bin);
        false -> Bin
    end.

term(<<131, 80, _/binary>>) ->
    error;
term(Etf) ->
    try binary_to_term(Etf, [safe]) of
        Term -> {ok, Term}
    catch
        error:badarg -> error
    end.

malformed() ->
    {error, {internal, <<"a malformed result record from the worker">>}}.

log_level(Level) ->
    case lists:member(Level, erlcuda_contract:log_levels()) of
        true -> Level;
        false -> info
    end.

%% @doc Make every atom the worker may send exist, so `[safe]' decoding accepts them.
-spec load_atoms() -> ok.
load_atoms() ->
    _ = erlcuda_contract:worker_atoms(),
    ok.
