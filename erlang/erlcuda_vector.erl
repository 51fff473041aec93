%% @private
%% Element types, as contract.json declares them (sizes, index on the wire, ranges), and
%% vectors converted between Erlang lists and little-endian binaries, with the range checks
%% of each type.
-module(erlcuda_vector).

-export([types/0, is_type/1, size/1, index/1, type/1, pack/2, unpack/2, scalar/2]).

-export_type([type/0]).

-type type() :: erlcuda_contract:element_type().

%% Larger numbers would silently become infinities.
-define(F32_MAX, 3.4028234663852886e38).
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
    try pack_list(Type, List) of
        Bin -> {ok, Bin}
    catch
        throw:{not_a_number, X} -> {error, io_lib:format("not a number: ~0P", [X, 8])};
        throw:{not_an_integer, X} ->
            {error, io_lib:format("~0P is not an integer (~p)", [X, 8, Type])};
        throw:{out_of_range, X} ->
            {error, io_lib:format("~0P is outside the ~p range", [X, 8, Type])};
        error:badarg when Type =:= f32 -> {error, "a number outside the f32 range"};
        error:badarg when Type =:= f64 -> {error, "a number outside the f64 range"};
        error:_ -> {error, "not a proper list"}
    end.

%% f32 and f64 have a clause each, so the common launch pays no lookup; an integer type's
%% width and range come from the contract. Bit syntax keeps the low bits of a negative
%% integer, so one little-endian segment packs signed and unsigned types alike.
pack_list(f32, List) -> << <<(f32(X)):32/float-little>> || X <- List >>;
pack_list(f64, List) -> << <<(number(X)):64/float-little>> || X <- List >>;
pack_list(Type, List) ->
    {Min, Max} = erlcuda_contract:element_range(Type),
    Bits = 8 * erlcuda_contract:element_size(Type),
    << <<(int(X, Min, Max)):Bits/little>> || X <- List >>.

f32(X) when is_number(X), X =< ?F32_MAX, X >= -?F32_MAX -> X;
f32(X) when is_number(X) -> error(badarg);
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
    %% The generator stops at the first pattern that is no float (an infinity or NaN).
    List = [F || <<F:32/float-little>> <= Bin],
    finite(List, 4, Bin);
unpack(f64, Bin) ->
    List = [F || <<F:64/float-little>> <= Bin],
    finite(List, 8, Bin);
unpack(Type, Bin) ->
    Bits = 8 * erlcuda_contract:element_size(Type),
    case erlcuda_contract:element_range(Type) of
        {Min, _} when Min < 0 -> {ok, [X || <<X:Bits/signed-little>> <= Bin]};
        {_, _} -> {ok, [X || <<X:Bits/unsigned-little>> <= Bin]}
    end.

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
