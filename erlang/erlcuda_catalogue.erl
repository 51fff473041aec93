%% @private
%% The kernels a launch may name, with what each takes and returns. The built-in ones come
%% from the wire contract (`erlcuda_contract:kernels/0'); this module is the one place that
%% answers "which kernels exist", so kernels added at run time join here.
-module(erlcuda_catalogue).

-export([lookup/1, kernels/0]).

-define(KEY, {?MODULE, builtin}).

%% @doc The spec of `Kernel', or `error' when there is no such kernel.
-spec lookup(term()) -> {ok, erlcuda_contract:spec()} | error.
lookup(Kernel) when is_atom(Kernel) ->
    maps:find(Kernel, builtin());
lookup(_) ->
    error.

%% @doc Every kernel, by name.
-spec kernels() -> [erlcuda_contract:spec()].
kernels() ->
    erlcuda_contract:kernels().

builtin() ->
    case persistent_term:get(?KEY, undefined) of
        undefined ->
            Specs = maps:from_list([{Name, S} || #{name := Name} = S <- kernels()]),
            persistent_term:put(?KEY, Specs),
            Specs;
        Specs ->
            Specs
    end.
