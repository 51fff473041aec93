%% @private
%% Element types, as contract.json declares them (sizes, index on the wire, ranges), and
%% vectors converted between Erlang lists and little-endian binaries, with the range checks
%% of each type.
-module(erlcuda_vector).

-export([types/0, is_type/1, size/1, index/1, type/1, pack/2, pack_unranged/2, in_f32_range/1,
         f32_range_error/0, unpack/2, scalar/2]).

-export_type([type/0]).

-type type() :: erlcuda_contract:element_type().

%% Larger numbers would silently become infinities.
-define(F32_MAX, 3.4028234663852886e38).
-define(F32(X), is_number(X), X =< ?F32_MAX, X >= -?F32_MAX).
%% Elements packed into one binary before the next is begun.
-define(CHUNK, 4096).
-define(NON_FINITE, <<"the result holds an infinity or NaN, which Erlang floats cannot "
                      "hold; {format, binary} returns the raw values">>).

%% @doc The element types, in the order of their index on the wire.
-spec types() -> [type()].
types() ->
    erlcuda_contract:element_types().

-spec is_type(term()) -> boolean().
is_type(T) ->
    lists:member(T, types()).

%% @doc Bytes per element.
-spec size(type()) -> pos_integer().
size(Type) ->
    erlcuda_contract:element_size(Type).

%% @doc The type's byte on the wire (its place in contract.json's element_types).
-spec index(type()) -> non_neg_integer().
index(Type) ->
    erlcuda_contract:element_index(Type).

%% @doc The type of a byte on the wire; `error' for none.
-spec type(byte()) -> type() | error.
type(Byte) ->
    erlcuda_contract:element_type(Byte).

%% @doc A list of numbers as a little-endian binary of `Type': floats (or integers) within
%% range for f32 and f64, integers within range for the integer types. `{error, Why}' names
%% the first element that does not fit.
-spec pack(type(), list()) -> {ok, binary()} | {error, iodata()}.
pack(Type, List) ->
    caught(Type, fun() -> pack_list(Type, List) end).

%% @doc `pack/2' of f32 without the range check, for a caller that makes it later
%% (`in_f32_range/1'): meanwhile a number beyond the range is an infinity in the binary.
-spec pack_unranged(f32, list()) -> {ok, binary()} | {error, iodata()}.
pack_unranged(f32, List) ->
    caught(f32, fun() -> joined(numbers(List, 32, 0, <<>>, [])) end).

%% @doc Whether every number of a list (one `pack_unranged/2' took) is within f32's range.
-spec in_f32_range([number()]) -> boolean().
in_f32_range([A, B, C, D, E, F, G, H | T])
  when ?F32(A), ?F32(B), ?F32(C), ?F32(D), ?F32(E), ?F32(F), ?F32(G), ?F32(H) ->
    in_f32_range(T);
in_f32_range([A | T]) when ?F32(A) ->
    in_f32_range(T);
in_f32_range([]) ->
    true;
in_f32_range(_) ->
    false.

%% @doc What `pack/2' says of a number beyond f32's range.
-spec f32_range_error() -> string().
f32_range_error() ->
    "a number outside the f32 range".

caught(Type, Pack) ->
    try Pack() of
        Bin -> {ok, Bin}
    catch
        throw:{not_a_number, X} -> {error, io_lib:format("not a number: ~0P", [X, 8])};
        throw:{not_an_integer, X} ->
            {error, io_lib:format("~0P is not an integer (~p)", [X, 8, Type])};
        throw:{out_of_range, X} ->
            {error, io_lib:format("~0P is outside the ~p range", [X, 8, Type])};
        throw:f32_range -> {error, f32_range_error()};
        %% only an integer too large for a float fails a float segment
        error:badarg when Type =:= f32 -> {error, f32_range_error()};
        error:badarg when Type =:= f64 -> {error, "a number outside the f64 range"};
        error:_ -> {error, "not a proper list"}
    end.

%% f32 and f64 have a clause each, so the common launch pays no lookup; an integer type's
%% width and range come from the contract. Bit syntax keeps the low bits of a negative
%% integer, so one little-endian segment packs signed and unsigned types alike.
pack_list(f32, List) -> joined(f32s(List, 0, <<>>, []));
pack_list(f64, List) -> joined(numbers(List, 64, 0, <<>>, []));
pack_list(Type, List) ->
    {Min, Max} = erlcuda_contract:element_range(Type),
    Bits = 8 * erlcuda_contract:element_size(Type),
    << <<(int(X, Min, Max)):Bits/little>> || X <- List >>.

%% Eight elements a step, checked by guards, appended to a binary the runtime grows in
%% place, ?CHUNK elements a binary, the binaries joined once at the end: about half the time
%% of an element a step through a checking function, at every length (one binary grown to
%% megabytes is copied as it grows). A 32-bit float segment turns a number beyond the f32
%% range into an infinity without a word, so the range is checked here. An element that
%% fails its guard ends the fast loop, and f32/1 says why.
f32s(L, N, Acc, Done) when N >= ?CHUNK ->
    f32s(L, 0, <<>>, [Acc | Done]);
f32s([A, B, C, D, E, F, G, H | T], N, Acc, Done)
  when ?F32(A), ?F32(B), ?F32(C), ?F32(D), ?F32(E), ?F32(F), ?F32(G), ?F32(H) ->
    f32s(T, N + 8, <<Acc/binary, A:32/float-little, B:32/float-little, C:32/float-little,
                     D:32/float-little, E:32/float-little, F:32/float-little,
                     G:32/float-little, H:32/float-little>>, Done);
f32s([A | T], N, Acc, Done) ->
    f32s(T, N + 1, <<Acc/binary, (f32(A)):32/float-little>>, Done);
f32s([], _, Acc, Done) ->
    {Acc, Done};
f32s(_, _, _, _) ->
    error(improper_list).

%% Numbers checked by type alone, eight a step, `Bits' wide: f64, and f32 for a caller that
%% checks the range later (pack_unranged/2). A number beyond the f32 range becomes an
%% infinity; an integer too large for any float fails its segment (badarg).
numbers(L, Bits, N, Acc, Done) when N >= ?CHUNK ->
    numbers(L, Bits, 0, <<>>, [Acc | Done]);
numbers([A, B, C, D, E, F, G, H | T], Bits, N, Acc, Done)
  when is_number(A), is_number(B), is_number(C), is_number(D), is_number(E), is_number(F),
       is_number(G), is_number(H) ->
    numbers(T, Bits, N + 8, <<Acc/binary, A:Bits/float-little, B:Bits/float-little,
                              C:Bits/float-little, D:Bits/float-little, E:Bits/float-little,
                              F:Bits/float-little, G:Bits/float-little,
                              H:Bits/float-little>>, Done);
numbers([A | T], Bits, N, Acc, Done) ->
    numbers(T, Bits, N + 1, <<Acc/binary, (number(A)):Bits/float-little>>, Done);
numbers([], _, _, Acc, Done) ->
    {Acc, Done};
numbers(_, _, _, _, _) ->
    error(improper_list).

%% The chunks in order, one binary: the last chunk alone is taken as it is.
joined({Last, []}) -> Last;
joined({Last, Done}) -> iolist_to_binary(lists:reverse(Done, [Last])).

f32(X) when ?F32(X) -> X;
f32(X) when is_number(X) -> throw(f32_range);
f32(X) -> throw({not_a_number, X}).

number(X) when is_number(X) -> X;
number(X) -> throw({not_a_number, X}).

int(X, Min, Max) when is_integer(X), X >= Min, X =< Max -> X;
int(X, _, _) when is_integer(X) -> throw({out_of_range, X});
int(X, _, _) -> throw({not_an_integer, X}).

%% @doc A binary of `Type' as a list: floats for f32 and f64 (`non_finite' where it holds an
%% infinity or NaN), integers for the others.
-spec unpack(type(), binary()) -> {ok, list()} | {error, {non_finite, binary()}}.
unpack(f32, Bin) ->
    try {ok, floats(Bin)}
    catch throw:non_finite -> {error, {non_finite, ?NON_FINITE}}
    end;
unpack(f64, Bin) ->
    List = [F || <<F:64/float-little>> <= Bin],
    finite(List, 8, Bin);
unpack(Type, Bin) ->
    Bits = 8 * erlcuda_contract:element_size(Type),
    case erlcuda_contract:element_range(Type) of
        {Min, _} when Min < 0 -> {ok, [X || <<X:Bits/signed-little>> <= Bin]};
        {_, _} -> {ok, [X || <<X:Bits/unsigned-little>> <= Bin]}
    end.

%% Eight floats a step; a pattern that is no float (an infinity or NaN) matches no clause
%% but the last.
floats(<<A:32/float-little, B:32/float-little, C:32/float-little, D:32/float-little,
         E:32/float-little, F:32/float-little, G:32/float-little, H:32/float-little,
         Rest/binary>>) ->
    [A, B, C, D, E, F, G, H | floats(Rest)];
floats(<<A:32/float-little, Rest/binary>>) ->
    [A | floats(Rest)];
floats(<<>>) ->
    [];
floats(_) ->
    throw(non_finite).

finite(List, Size, Bin) ->
    case length(List) * Size =:= byte_size(Bin) of
        true -> {ok, List};
        false -> {error, {non_finite, ?NON_FINITE}}
    end.

%% @doc A scalar argument's 8 bytes: the value of `Type', little-endian, zero-padded.
-spec scalar(type(), term()) -> {ok, <<_:64>>} | {error, iodata()}.
scalar(Type, X) ->
    case pack(Type, [X]) of
        {ok, Bin} -> {ok, <<Bin/binary, 0:((8 - byte_size(Bin)) * 8)>>};
        {error, _} = Error -> Error
    end.
