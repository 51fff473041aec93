%% @private
%% The application environment, checked: a bad value stops the application's start with a
%% clear reason instead of a worker that restarts forever.
-module(erlcuda_config).

-export([load/0, keys/0]).

-export_type([config/0]).

%% Timeouts longer than a day are mistakes (and past 2^32 - 1 ms, no timer takes them).
-define(MAX_MS, 86400000).

-type config() :: #{backend := auto | cpu | cuda,
                    cpu_devices := pos_integer(),
                    python := default | string(),
                    batching := boolean(),
                    max_batch := pos_integer(),
                    max_queue := pos_integer(),
                    start_timeout := pos_integer(),
                    watchdog_ms := pos_integer() | infinity,
                    spin_us := auto | non_neg_integer(),
                    worker_args := [string()],
                    shm_dir := auto | none | string(),
                    shm_threshold := pos_integer(),
                    worker_module := string(),
                    python_path := [string()],
                    buffer_limit := pos_integer() | infinity,
                    cluster_exclude := [node()],
                    cluster_prefer := [node()]}.

%% @doc Every key with its default; the `.app.src' documents the same ones.
-spec keys() -> [{atom(), term()}].
keys() ->
    [{backend, auto}, {cpu_devices, 1}, {python, default}, {batching, true},
     {max_batch, 256}, {max_queue, 10000}, {start_timeout, 120000}, {watchdog_ms, 30000},
     {spin_us, auto}, {worker_args, []}, {shm_dir, auto}, {shm_threshold, 1048576},
     {worker_module, "erlcuda"}, {python_path, []},
     {buffer_limit, infinity}, {cluster_exclude, []}, {cluster_prefer, []}].

%% @doc The checked configuration, or the first key whose value is wrong.
-spec load() -> {ok, config()} | {error, {bad_config, atom(), term()}}.
load() ->
    lists:foldl(fun(_, {error, _} = E) -> E;
                   ({Key, Default}, {ok, Acc}) ->
                        Value = application:get_env(erlcuda, Key, Default),
                        case valid(Key, Value) of
                            true -> {ok, Acc#{Key => text(Key, Value)}};
                            false -> {error, {bad_config, Key, Value}}
                        end
                end, {ok, #{}}, keys()).

valid(backend, V) -> lists:member(V, [auto, cpu, cuda]);
valid(python, default) -> true;
valid(python, V) -> is_text(V) andalso V =/= [] andalso V =/= <<>>;
valid(watchdog_ms, infinity) -> true;
valid(buffer_limit, infinity) -> true;
valid(spin_us, auto) -> true;
valid(spin_us, V) -> is_integer(V) andalso V >= 0;
valid(shm_dir, V) when V =:= auto; V =:= none -> true;
valid(shm_dir, V) -> is_text(V) andalso V =/= [] andalso V =/= <<>>;
valid(K, V) when K =:= cluster_exclude; K =:= cluster_prefer ->
    try lists:all(fun is_atom/1, V) catch error:_ -> false end;
valid(worker_args, V) ->
    try lists:all(fun is_text/1, V) catch error:_ -> false end;
valid(python_path, V) ->
    try lists:all(fun(D) -> is_text(D) andalso D =/= [] andalso D =/= <<>> end, V)
    catch error:_ -> false
    end;
valid(worker_module, V) -> is_module_name(V);
valid(batching, V) -> is_boolean(V);
valid(cpu_devices, V) -> is_integer(V) andalso V > 0 andalso V =< erlcuda_status:max_devices();
valid(K, V) when K =:= start_timeout; K =:= watchdog_ms -> is_integer(V) andalso V > 0 andalso V =< ?MAX_MS;
valid(_, V) -> is_integer(V) andalso V > 0.

%% A Python module's dotted name (`-m' runs it): identifiers of ASCII letters, digits and
%% underscores, none starting with a digit.
is_module_name(V) ->
    is_text(V) andalso lists:all(fun is_identifier/1,
                                 string:split(unicode:characters_to_list(V), ".", all)).

is_identifier([C | Rest]) when C >= $a, C =< $z; C >= $A, C =< $Z; C =:= $_ ->
    lists:all(fun(D) -> D >= $a andalso D =< $z orelse D >= $A andalso D =< $Z
                            orelse D >= $0 andalso D =< $9 orelse D =:= $_ end, Rest);
is_identifier(_) -> false.

%% Text as a charlist or, as Elixir writes it, a UTF-8 binary.
is_text(V) when is_binary(V) -> is_list(unicode:characters_to_list(V));
is_text(V) -> io_lib:printable_unicode_list(V).

text(K, V) when is_binary(V), K =:= python; is_binary(V), K =:= shm_dir;
                is_binary(V), K =:= worker_module ->
    unicode:characters_to_list(V);
text(K, V) when K =:= worker_args; K =:= python_path -> [unicode:characters_to_list(A) || A <- V];
text(_, V) -> V.
