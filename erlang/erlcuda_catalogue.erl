%% @private
%% The kernels a launch may name, with what each takes and returns. The built-in ones come
%% from the wire contract (`erlcuda_contract:kernels/0'); user kernels join at run time, once
%% erlcuda_loader has loaded their module into the worker. This module is the one place that
%% answers "which kernels exist".
%%
%% Every launch looks its kernel up: the catalogue lives in persistent terms, read without
%% a copy or a lock, and written only when a module is loaded or unloaded, by the loader's
%% server, one change at a time. It also keeps each loaded module's declaration, so that a
%% new worker gets every module again before it takes jobs (`replay/0', called by the port
%% owner). A load in flight is in that list too: a worker that starts while the load runs
%% gets it as well.
-module(erlcuda_catalogue).

-export([lookup/1, kernels/0, modules/0, replay/0, reset/0, conflict/2, commit/1,
         pending/1, drop/1]).

-export_type([declaration/0]).

-define(BUILTIN, {?MODULE, builtin}).
-define(KERNELS, {?MODULE, kernels}).
-define(MODULES, {?MODULE, modules}).
-define(PENDING, {?MODULE, pending}).

%% A module as loaded: the control call that loads it and the specs of its kernels.
-type declaration() :: #{module := atom(),
                         call := {load | elementwise, list()},
                         specs := #{atom() => erlcuda_contract:spec()}}.

%% @doc The spec of `Kernel', or `error' when there is no such kernel.
-spec lookup(term()) -> {ok, erlcuda_contract:spec()} | error.
lookup(Kernel) when is_atom(Kernel) ->
    case maps:find(Kernel, builtin()) of
        error -> maps:find(Kernel, persistent_term:get(?KERNELS, #{}));
        Found -> Found
    end;
lookup(_) ->
    error.

%% @doc Every kernel: the built-in ones, then the loaded ones by name.
-spec kernels() -> [erlcuda_contract:spec()].
kernels() ->
    erlcuda_contract:kernels()
        ++ [S || {_, S} <- lists:sort(maps:to_list(persistent_term:get(?KERNELS, #{})))].

%% @doc The loaded modules, by name.
-spec modules() -> [atom()].
modules() ->
    lists:sort(maps:keys(persistent_term:get(?MODULES, #{}))).

%% @doc The control calls that load every module into a new worker:
%% `{Module, Function, Args}'.
-spec replay() -> [{atom(), load | elementwise, list()}].
replay() ->
    Modules = persistent_term:get(?MODULES, #{}),
    All = case persistent_term:get(?PENDING, none) of
              #{module := M} = Pending -> Modules#{M => Pending};
              none -> Modules
          end,
    [{M, Fun, Args} || {M, #{call := {Fun, Args}}} <- lists:sort(maps:to_list(All))].

%% @doc Forget every loaded module (an application start begins with none).
-spec reset() -> ok.
reset() ->
    _ = [persistent_term:erase(K) || K <- [?KERNELS, ?MODULES, ?PENDING]],
    ok.

%% @doc `ok' when `Names' may be kernels of `Module': a kernel name belongs to one module,
%% and never to a built-in one.
-spec conflict(atom(), [atom()]) -> ok | {error, {already_loaded, atom()}}.
conflict(Module, Names) ->
    Kernels = persistent_term:get(?KERNELS, #{}),
    Taken = [N || N <- Names,
                  maps:is_key(N, builtin()) orelse
                      case maps:find(N, Kernels) of
                          {ok, #{module := M}} -> M =/= Module;
                          error -> false
                      end],
    case Taken of
        [N | _] -> {error, {already_loaded, N}};
        [] -> ok
    end.

%% @doc Put a declared module into the catalogue (as once the worker has loaded it). Only
%% the loader calls it, and tests, which have no GPU to load modules into.
-spec commit(declaration()) -> ok.
commit(#{module := Module, specs := Specs} = D) ->
    Modules = persistent_term:get(?MODULES, #{}),
    Old = case maps:find(Module, Modules) of
              {ok, #{specs := OldSpecs}} -> maps:keys(OldSpecs);
              error -> []
          end,
    Kernels = maps:merge(maps:without(Old, persistent_term:get(?KERNELS, #{})), Specs),
    persistent_term:put(?MODULES, Modules#{Module => D}),
    persistent_term:put(?KERNELS, Kernels).

%% @doc The module whose load is in flight (a worker starting meanwhile gets it too), or
%% `none' once it ended.
-spec pending(declaration() | none) -> ok.
pending(none) ->
    _ = persistent_term:erase(?PENDING),
    ok;
pending(Declaration) ->
    persistent_term:put(?PENDING, Declaration).

%% @doc Drop a module's kernels and declaration: `true' if it was loaded.
-spec drop(atom()) -> boolean().
drop(Module) ->
    Modules = persistent_term:get(?MODULES, #{}),
    case maps:take(Module, Modules) of
        {#{specs := Specs}, Rest} ->
            Kernels = maps:without(maps:keys(Specs), persistent_term:get(?KERNELS, #{})),
            persistent_term:put(?KERNELS, Kernels),
            persistent_term:put(?MODULES, Rest),
            true;
        error ->
            false
    end.

builtin() ->
    case persistent_term:get(?BUILTIN, undefined) of
        undefined ->
            Specs = maps:from_list([{Name, S} || #{name := Name} = S <- erlcuda_contract:kernels()]),
            persistent_term:put(?BUILTIN, Specs),
            Specs;
        Specs ->
            Specs
    end.

